//! The byte pipe of an egress connection between two sockets, moved by
//! `splice(2)` through a kernel pipe per direction where both sockets are
//! the relay's alone, and copied through a buffer where one of them is a
//! socket a guest handed over ([`HandedSocket`]): past a connection's
//! first bytes, a download between the relay's own sockets never enters
//! either process, which matters on a relay that carries it three sockets
//! deep (site, broker, supervisor, program).
//!
//! Each direction starts by copying through a small buffer, and moves to
//! its own pipe once it has carried [`SPLICE_AFTER`] bytes (or, with a
//! handed socket on either side, to a buffer of [`SPLICE_CHUNK`]): a
//! connection that carries little (most of them, and every one of a flood
//! held open without traffic) costs two descriptors, a download four more.
//! The pipe is filled from one socket as far as the socket has bytes, then
//! drained into the other; readiness comes from the runtime's own
//! registration of each socket, so no descriptor is registered twice. The
//! end of one side's stream shuts down the write side of the other and the
//! other direction goes on; the first error ends both.
//!
//! A handed socket's open file description is shared with the guest that
//! sent it, and with it `O_NONBLOCK` and `SO_LINGER`: the guest may make
//! it blocking at any moment. So nothing here ever calls `read`, `write`
//! or `splice` on a socket: every copy is `recv(MSG_DONTWAIT)` and
//! `send(MSG_DONTWAIT | MSG_NOSIGNAL)`, which never block whatever the
//! file's flags, and `splice` (which follows the file's `O_NONBLOCK`, not
//! `SPLICE_F_NONBLOCK`) only ever touches the relay's own sockets and
//! pipes. A handed socket is never closed here either: its last close may
//! linger, so it goes to the [`CloseOff`] it was given.

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::sys::socket::{recv, send, setsockopt, shutdown, sockopt, MsgFlags, Shutdown};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// Bytes one splice call asks for; also the size each pipe is set to
/// (the default pipe is kept when the kernel refuses the size, which only
/// costs more calls), and the copy buffer of a direction past
/// [`SPLICE_AFTER`] when a handed socket keeps it from a pipe.
pub const SPLICE_CHUNK: usize = 256 * 1024;
/// Bytes a direction copies through its buffer before it takes a pipe.
pub const SPLICE_AFTER: usize = 256 * 1024;
/// The copy buffer of a direction before it takes a pipe.
const COPY_CHUNK: usize = 16 * 1024;

/// A connected stream socket whose readiness the runtime tracks.
pub trait SpliceSocket: Sync {
    /// Runs `call` on the socket once the runtime sees it ready for
    /// `interest`, again after each `WouldBlock` (which clears the
    /// runtime's readiness).
    fn io_when_ready<R: Send>(
        &self,
        interest: Interest,
        call: impl FnMut(BorrowedFd<'_>) -> io::Result<R> + Send,
    ) -> impl Future<Output = io::Result<R>> + Send;
    /// Whether another process shares this socket's open file description
    /// (and may change its flags): then it is never spliced.
    fn shared(&self) -> bool {
        false
    }
    /// Shuts down the write side (gone already is as good as shut down;
    /// `shutdown` never waits).
    fn shut_write(&self);
}

macro_rules! splice_socket {
    ($t:ty) => {
        impl SpliceSocket for $t {
            async fn io_when_ready<R: Send>(
                &self,
                interest: Interest,
                mut call: impl FnMut(BorrowedFd<'_>) -> io::Result<R> + Send,
            ) -> io::Result<R> {
                self.async_io(interest, || call(self.as_fd())).await
            }
            fn shut_write(&self) {
                let _ = shutdown(self.as_raw_fd(), Shutdown::Write);
            }
        }
    };
}

splice_socket!(TcpStream);
splice_socket!(UnixStream);

/// Where a [`HandedSocket`] goes to be closed: never the thread that drops
/// it (a last close of a lingering socket blocks for as long as its
/// linger, which the guest sets).
pub trait CloseOff: Send + Sync {
    /// Takes `fd` to close it somewhere that may block, abortively (any
    /// unsent bytes dropped).
    fn close_off(&self, fd: OwnedFd);
    /// Takes `fd` to close it somewhere that may block, its unsent bytes
    /// still delivered: the end of a relay that carried everything.
    fn close_off_gracefully(&self, fd: OwnedFd) {
        self.close_off(fd);
    }
}

/// A TCP socket a guest handed over: shared with the guest, so only ever
/// `recv`'d and `send`'d without waiting, never spliced, never read or
/// written plainly, and closed by its [`CloseOff`] when dropped. It is
/// registered with the runtime as a bare descriptor: the runtime's socket
/// types insist on `O_NONBLOCK` when they take one, a flag the guest may
/// clear at any moment, and nothing here depends on it.
pub struct HandedSocket {
    /// Always `Some` until dropped.
    fd: Option<AsyncFd<OwnedFd>>,
    closer: Arc<dyn CloseOff>,
    /// Closed gracefully when dropped ([`HandedSocket::ended_cleanly`]).
    clean: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for HandedSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandedSocket")
            .field("fd", &self.fd.as_ref().map(|fd| fd.get_ref().as_raw_fd()))
            .finish_non_exhaustive()
    }
}

impl HandedSocket {
    /// Registers `fd` (a connected TCP socket) with the runtime; `closer`
    /// closes it when it is dropped, or at once if it cannot be registered.
    pub fn new(fd: OwnedFd, closer: Arc<dyn CloseOff>) -> io::Result<Self> {
        // Deprecated for descriptors a type may swap under the runtime; an
        // `OwnedFd` keeps its one descriptor for as long as it lives, which
        // is what the unsafe constructor asks to be promised.
        #[allow(deprecated)]
        let registered = AsyncFd::try_with_interest(fd, Interest::READABLE | Interest::WRITABLE);
        match registered {
            Ok(fd) => Ok(Self {
                fd: Some(fd),
                closer,
                clean: std::sync::atomic::AtomicBool::new(false),
            }),
            Err(e) => {
                let (fd, cause) = e.into_parts();
                closer.close_off(fd);
                Err(cause)
            }
        }
    }

    fn registered(&self) -> io::Result<&AsyncFd<OwnedFd>> {
        self.fd
            .as_ref()
            .ok_or_else(|| io::Error::other("the handed socket is closed"))
    }

    /// Marks the relay as ended with both streams carried to their end:
    /// the socket is closed gracefully then, so that bytes still in its
    /// send queue reach the program (else abortively).
    pub fn ended_cleanly(&self) {
        self.clean.store(true, Ordering::Relaxed);
    }

    /// Sets `TCP_NODELAY` (a flag the guest may change again; only latency
    /// depends on it).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        Ok(setsockopt(
            self.registered()?.get_ref(),
            sockopt::TcpNoDelay,
            &on,
        )?)
    }
}

impl SpliceSocket for HandedSocket {
    async fn io_when_ready<R: Send>(
        &self,
        interest: Interest,
        mut call: impl FnMut(BorrowedFd<'_>) -> io::Result<R> + Send,
    ) -> io::Result<R> {
        self.registered()?
            .async_io(interest, |fd| call(fd.as_fd()))
            .await
    }

    fn shared(&self) -> bool {
        true
    }

    fn shut_write(&self) {
        if let Some(fd) = &self.fd {
            let _ = shutdown(fd.get_ref().as_raw_fd(), Shutdown::Write);
        }
    }
}

impl Drop for HandedSocket {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            // Deregisters (never closes) and gives the descriptor back.
            let fd = fd.into_inner();
            if self.clean.load(Ordering::Relaxed) {
                self.closer.close_off_gracefully(fd);
            } else {
                self.closer.close_off(fd);
            }
        }
    }
}

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
    loop {
        if copied >= SPLICE_AFTER {
            if !from.shared() && !to.shared() {
                drop(buf);
                return spliced(from, to, moved).await;
            }
            if buf.len() < SPLICE_CHUNK {
                buf.resize(SPLICE_CHUNK, 0);
            }
        }
        let got = from
            .io_when_ready(Interest::READABLE, |fd| {
                Ok(recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)?)
            })
            .await?;
        if got == 0 {
            to.shut_write();
            return Ok(());
        }
        let mut sent = 0;
        while sent < got {
            let put = to
                .io_when_ready(Interest::WRITABLE, |fd| {
                    Ok(send(
                        fd.as_raw_fd(),
                        &buf[sent..got],
                        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                    )?)
                })
                .await?;
            sent += nonzero(put)?;
            count(moved, put);
        }
        copied += got;
    }
}

/// The rest of one direction between two sockets of the relay's own,
/// through a pipe.
async fn spliced<F: SpliceSocket, T: SpliceSocket>(
    from: &F,
    to: &T,
    moved: &AtomicU64,
) -> io::Result<()> {
    let (out, inp) = pipe()?;
    loop {
        let got = from
            .io_when_ready(Interest::READABLE, |fd| {
                Ok(splice(fd, None, &inp, None, SPLICE_CHUNK, flags())?)
            })
            .await?;
        if got == 0 {
            to.shut_write();
            return Ok(());
        }
        let mut left = got;
        while left > 0 {
            let put = to
                .io_when_ready(Interest::WRITABLE, |fd| {
                    Ok(splice(&out, None, fd, None, left, flags())?)
                })
                .await?;
            left -= nonzero(put)?;
            count(moved, put);
        }
    }
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

    /// Records what it is given to close, and closes nothing itself.
    #[derive(Default)]
    struct Kept(std::sync::Mutex<Vec<OwnedFd>>);

    impl CloseOff for Kept {
        fn close_off(&self, fd: OwnedFd) {
            self.0.lock().unwrap().push(fd);
        }
    }

    /// A handed socket whose guest keeps a duplicate, clears `O_NONBLOCK`
    /// on it, reads what the program sends itself, and whose program
    /// never reads: the relay never blocks the one thread of the runtime,
    /// and what it drops goes to its closer.
    #[tokio::test(flavor = "current_thread")]
    async fn a_handed_socket_made_blocking_never_blocks_the_runtime() {
        let (program, proxy) = tcp_pair().await;
        let guest_copy = proxy.as_fd().try_clone_to_owned().unwrap();
        let fd = proxy.into_std().unwrap();
        // The guest's flags are the socket's: blocking already when it is
        // handed over, and the relay must still take it.
        fcntl(&guest_copy, FcntlArg::F_SETFL(OFlag::empty())).unwrap();
        let kept = Arc::new(Kept::default());
        let handed = HandedSocket::new(OwnedFd::from(fd), kept.clone()).unwrap();
        assert!(handed.shared());
        handed.set_nodelay(true).unwrap();
        let flags = fcntl(handed.fd.as_ref().unwrap().get_ref(), FcntlArg::F_GETFL).unwrap();
        assert_eq!(flags & OFlag::O_NONBLOCK.bits(), 0, "shared description");
        let (relay_far, mut far) = UnixStream::pair().unwrap();
        let up = AtomicU64::new(0);
        let down = AtomicU64::new(0);
        // The far end sends far more than the program's buffers hold.
        let feeder = tokio::spawn(async move {
            let chunk = vec![7u8; 1 << 20];
            for _ in 0..64 {
                if far.write_all(&chunk).await.is_err() {
                    break;
                }
            }
            far
        });
        // The program sends; the guest takes the bytes before the relay.
        let mut program_std = program.into_std().unwrap();
        program_std.set_nonblocking(false).unwrap();
        let guest_std = std::net::TcpStream::from(guest_copy);
        let thief = std::thread::spawn(move || {
            use std::io::{Read, Write};
            program_std.write_all(b"stolen").unwrap();
            let mut got = [0u8; 6];
            (&guest_std).read_exact(&mut got).unwrap();
            (program_std, guest_std, got)
        });
        let mut ticks = 0;
        let mut relayed = Box::pin(relay(&handed, &relay_far, &up, &down));
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(20));
        while ticks < 25 {
            tokio::select! {
                r = &mut relayed => panic!("the relay ended: {r:?}"),
                _ = tick.tick() => ticks += 1,
            }
        }
        let (_program, _guest, got) = thief.join().unwrap();
        assert_eq!(&got, b"stolen");
        assert_eq!(up.load(Ordering::Relaxed), 0, "the guest read it first");
        assert!(down.load(Ordering::Relaxed) > 0, "some bytes went down");
        assert!(
            down.load(Ordering::Relaxed) < 64 << 20,
            "the program read none"
        );
        drop(relayed);
        assert!(kept.0.lock().unwrap().is_empty());
        drop(handed);
        assert_eq!(kept.0.lock().unwrap().len(), 1, "the closer has it");
        feeder.abort();
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
