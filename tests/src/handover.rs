//! A hostile supervisor in front of a desktop's real one, for the egress
//! hand-over: it answers the broker's first parked egress sessions itself
//! and passes every other connection through to the real supervisor.
//!
//! On each session it answers, it asks for an allowed host-side upstream
//! with `hand_over`, hands over one end of a loopback TCP pair, and keeps
//! a duplicate of it: it then clears `O_NONBLOCK` on that duplicate again
//! and again, sets a linger of an hour, and reads what the program end sends
//! before the broker can. The program end never reads. This is what a guest
//! root can do by replacing `supervisor.sock`; the test runs it from the
//! host (the run directory is a bind mount), as root, which is what guest
//! root is without a user namespace.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use dormouse_protocol::egress::{EgressForm, EgressOpen, EgressVerdict};
use dormouse_protocol::frame;
use dormouse_protocol::{Request, Response};
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::socket::{recv, sendmsg, setsockopt, sockopt, ControlMessage, MsgFlags};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

const NO_LINGER: nix::libc::linger = nix::libc::linger {
    l_onoff: 1,
    l_linger: 0,
};

/// What the hostile supervisor did and holds.
#[derive(Debug, Default)]
pub struct Hostile {
    /// Set to start answering egress sessions (until then they wait, and
    /// every other connection passes through).
    pub go: std::sync::atomic::AtomicBool,
    /// Sockets handed over so far.
    pub handed: AtomicUsize,
    /// Bytes it read itself from the handed sockets' duplicates.
    pub stolen: AtomicUsize,
    /// Every pair it keeps: (the program's end, the duplicate of the
    /// handed end).
    kept: Mutex<Vec<(std::net::TcpStream, OwnedFd)>>,
}

impl Hostile {
    /// Drops every socket it kept (the end of the attack), each without a
    /// linger first.
    pub fn release(&self) {
        if let Ok(mut kept) = self.kept.lock() {
            for (_, dup) in kept.iter() {
                let _ = setsockopt(dup, sockopt::Linger, &NO_LINGER);
            }
            kept.clear();
        }
    }
}

/// Serves `listener` (bound at the desktop's `supervisor.sock`) until the
/// task is aborted: the first `hand_overs` `egress_accept` sessions are
/// answered with an `egress_open` for `host:port` and a hostile hand-over;
/// everything else goes to the real supervisor at `real`.
pub async fn serve(
    listener: UnixListener,
    real: PathBuf,
    host: String,
    port: u16,
    hand_overs: usize,
    hostile: Arc<Hostile>,
) {
    let taken = Arc::new(AtomicUsize::new(0));
    while let Ok((stream, _)) = listener.accept().await {
        let (real, host, hostile, taken) = (
            real.clone(),
            host.clone(),
            Arc::clone(&hostile),
            Arc::clone(&taken),
        );
        tokio::spawn(async move {
            if let Err(e) = one(stream, real, host, port, hand_overs, hostile, taken).await {
                eprintln!("hostile supervisor: a connection ended: {e:#}");
            }
        });
    }
}

async fn one(
    mut stream: UnixStream,
    real: PathBuf,
    host: String,
    port: u16,
    hand_overs: usize,
    hostile: Arc<Hostile>,
    taken: Arc<AtomicUsize>,
) -> Result<()> {
    let mut buf = Vec::new();
    let request = loop {
        if let Some((frame, _)) = frame::decode::<Request>(&buf)? {
            break frame.message;
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let mine = matches!(request, Request::EgressAccept)
        && taken.fetch_add(1, Ordering::SeqCst) < hand_overs;
    if mine {
        while !hostile.go.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    } else {
        let mut to_real = UnixStream::connect(&real).await?;
        to_real.write_all(&buf).await?;
        tokio::io::copy_bidirectional(&mut stream, &mut to_real).await?;
        return Ok(());
    }
    let open = EgressOpen {
        id: u64::try_from(taken.load(Ordering::SeqCst)).unwrap_or(0),
        host,
        port,
        form: EgressForm::Connect,
        hand_over: true,
    };
    stream
        .write_all(&frame::encode(&Response::EgressOpen(open), &[])?)
        .await?;
    let mut got = Vec::new();
    let verdict = loop {
        if let Some((frame, _)) = frame::decode::<EgressVerdict>(&got)? {
            break frame.message;
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            bail!("the broker closed before its verdict");
        }
        got.extend_from_slice(&chunk[..n]);
    };
    if verdict != EgressVerdict::HandOver {
        bail!("the broker answered {verdict:?}, not a hand-over");
    }
    // The program's connection: its end, and the proxy's end handed over.
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let program = TcpStream::connect(l.local_addr()?).await?;
    let (proxy, _) = l.accept().await?;
    let program = program.into_std()?;
    let proxy = OwnedFd::from(proxy.into_std()?);
    stream.writable().await?;
    let byte = [1u8];
    let iov = [std::io::IoSlice::new(&byte)];
    let fds = [proxy.as_raw_fd()];
    sendmsg::<()>(
        stream.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .context("sending the socket")?;
    hostile.handed.fetch_add(1, Ordering::SeqCst);
    // The program asks for something; the guest takes the bytes itself.
    program.set_nonblocking(true)?;
    let dup = proxy.try_clone()?;
    hostile
        .kept
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .push((program.try_clone()?, dup));
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 3600,
    };
    let mut ask = [b'x'; 4096];
    ask[0] = b'G';
    let mut sink = vec![0u8; 65536];
    let mut asks = 0;
    loop {
        // Blocking again, lingering for an hour, whatever the broker set.
        let _ = fcntl(&proxy, FcntlArg::F_SETFL(OFlag::empty()));
        let _ = setsockopt(&proxy, sockopt::Linger, &linger);
        // The program asks for a while, then waits for an answer it never
        // reads: the connection goes quiet.
        if asks < 20 {
            asks += 1;
            let _ = std::io::Write::write(&mut &program, &ask);
        }
        while let Ok(n) = recv(proxy.as_fd().as_raw_fd(), &mut sink, MsgFlags::MSG_DONTWAIT) {
            if n == 0 {
                break;
            }
            hostile.stolen.fetch_add(n, Ordering::Relaxed);
        }
        if hostile.kept.lock().map(|k| k.is_empty()).unwrap_or(true) {
            // The test's own last close of the socket must not linger on
            // its runtime either.
            let _ = setsockopt(&proxy, sockopt::Linger, &NO_LINGER);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A host loopback upstream that sends `size` bytes to every connection
/// and never reads; how many connections it has seen and how many ended.
pub async fn upstream(size: u64) -> Result<(u16, Arc<(AtomicUsize, AtomicUsize)>)> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let port = l.local_addr()?.port();
    let seen = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let counts = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            counts.0.fetch_add(1, Ordering::SeqCst);
            let counts = Arc::clone(&counts);
            tokio::spawn(async move {
                let chunk = vec![0x5au8; 1 << 20];
                let mut left = size;
                while left > 0 {
                    if let Err(e) = s.write_all(&chunk).await {
                        eprintln!("upstream: ended after {} bytes: {e}", size - left);
                        break;
                    }
                    left = left.saturating_sub(1 << 20);
                }
                // Ended: the broker closed it (or all was sent).
                counts.1.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    Ok((port, seen))
}

/// `Threads:` of `/proc/<pid>/status` and the count of `/proc/<pid>/fd`.
pub fn threads_and_fds(pid: u32) -> Result<(usize, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .context("no Threads: line")?
        .trim()
        .parse()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((threads, fds))
}
