use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::*;

const WITHIN: Duration = Duration::from_secs(2);

/// A closer on a pool of its own that counts what it closed.
fn closer() -> (Closer, Arc<AtomicUsize>) {
    let closed = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&closed);
    let pool = dormouse_egress::ClosePool::with_close(
        Arc::new(move |fd| {
            drop(fd);
            seen.fetch_add(1, Ordering::SeqCst);
        }),
        Arc::new(|_| {}),
        Duration::from_secs(1),
    );
    (pool.closer(uuid::Uuid::new_v4()), closed)
}

async fn closed_reaches(closed: &AtomicUsize, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while closed.load(Ordering::SeqCst) < n {
        assert!(tokio::time::Instant::now() < deadline, "{n} closes");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(closed.load(Ordering::SeqCst), n);
}

/// A session whose guest end the test holds.
fn session() -> (EgressSession, UnixStream) {
    let (ours, theirs) = UnixStream::pair().expect("socket pair");
    (
        EgressSession {
            stream: ours,
            hand_over: true,
        },
        theirs,
    )
}

/// What a guest sends: `bytes` with `fds` as `SCM_RIGHTS`.
fn send(guest: &UnixStream, bytes: &[u8], fds: &[RawFd]) {
    let iov = [io::IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(guest.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).expect("sendmsg");
}

async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let program = TcpStream::connect(l.local_addr().expect("addr"))
        .await
        .expect("connect");
    let (proxy, _) = l.accept().await.expect("accept");
    (program, proxy)
}

#[tokio::test]
async fn a_connected_tcp_socket_is_taken_and_carries_bytes() {
    let (s, guest) = session();
    let (mut program, proxy) = tcp_pair().await;
    send(&guest, b"x", &[proxy.as_raw_fd()]);
    drop(proxy);
    let (closer, closed) = closer();
    let taken = s.take_client(WITHIN, &closer).await.expect("taken");
    let (relay_end, mut far) = UnixStream::pair().expect("pair");
    let (up, down) = (
        std::sync::atomic::AtomicU64::new(0),
        std::sync::atomic::AtomicU64::new(0),
    );
    far.write_all(b"to the program").await.expect("write");
    let relayed = dormouse_protocol::splice::relay(&taken, &relay_end, &up, &down);
    let mut buf = [0u8; 14];
    tokio::select! {
        r = relayed => panic!("relay ended: {r:?}"),
        r = program.read_exact(&mut buf) => { r.expect("read"); }
    }
    assert_eq!(&buf, b"to the program");
    // The session and the socket are closed by the closer, not here.
    s.close_with(&closer);
    drop(taken);
    closed_reaches(&closed, 2).await;
    let mut rest = Vec::new();
    program
        .read_to_end(&mut rest)
        .await
        .expect("the program sees the end");
}

#[tokio::test]
async fn anything_but_one_connected_tcp_socket_is_refused() {
    let (_program, proxy) = tcp_pair().await;
    let (pipe_r, _pipe_w) = nix::unistd::pipe().expect("pipe");
    let (unix_a, _unix_b) = UnixStream::pair().expect("pair");
    let unbound = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let cases: Vec<(&str, Vec<RawFd>)> = vec![
        ("no descriptor", vec![]),
        ("a pipe", vec![pipe_r.as_fd().as_raw_fd()]),
        ("a unix socket", vec![unix_a.as_raw_fd()]),
        ("a listening socket", vec![unbound.as_raw_fd()]),
        ("a UDP socket", vec![udp.as_raw_fd()]),
        ("two sockets", vec![proxy.as_raw_fd(), proxy.as_raw_fd()]),
        ("a hundred sockets", vec![proxy.as_raw_fd(); 100]),
    ];
    for (what, fds) in cases {
        let (s, guest) = session();
        send(&guest, b"x", &fds);
        let (closer, closed) = closer();
        let err = s.take_client(WITHIN, &closer).await.expect_err(what);
        assert!(!err.to_string().is_empty(), "{what}");
        // Every descriptor received went to the closer, none was dropped
        // by the kernel for want of room.
        closed_reaches(&closed, fds.len()).await;
    }
    // A guest that closes, or says nothing in time.
    let (closer, _) = closer();
    let (s, guest) = session();
    drop(guest);
    assert!(s.take_client(WITHIN, &closer).await.is_err(), "closed");
    let (s, _guest) = session();
    let err = s
        .take_client(Duration::from_millis(100), &closer)
        .await
        .expect_err("silent");
    assert!(err.to_string().contains("in time"), "{err}");
}
