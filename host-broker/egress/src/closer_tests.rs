use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use super::*;

/// A connected pair on loopback: (the peer, the socket to close).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let peer = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
    let (ours, _) = l.accept().expect("accept");
    (peer, ours)
}

fn fd() -> OwnedFd {
    let (_peer, ours) = tcp_pair();
    OwnedFd::from(ours)
}

fn counting() -> (StallFn, Arc<AtomicUsize>) {
    let n = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&n);
    (
        Arc::new(move |_| {
            seen.fetch_add(1, Ordering::Relaxed);
        }),
        n,
    )
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_lingering_socket_is_closed_at_once_and_reset() {
    let (mut peer, ours) = tcp_pair();
    // Unsent bytes the peer never reads, and a long linger: a plain close
    // of this socket would wait 5 s.
    ours.set_nonblocking(true).expect("nonblocking");
    let chunk = [1u8; 65536];
    loop {
        match (&ours).write(&chunk) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    rustix::net::sockopt::set_socket_linger(&ours, Some(Duration::from_secs(5))).expect("linger");
    let started = Instant::now();
    abortive_close(OwnedFd::from(ours));
    assert!(started.elapsed() < STALLED_AFTER, "{:?}", started.elapsed());
    peer.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut buf = vec![0u8; 1 << 20];
    let reset = loop {
        match peer.read(&mut buf) {
            Ok(0) => break false,
            Ok(_) => {}
            Err(e) => break e.kind() == ErrorKind::ConnectionReset,
        }
    };
    assert!(reset, "the peer sees a reset, not an orderly end");
}

#[test]
fn closes_run_off_the_caller_and_threads_end_when_idle() {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let close: CloseFn = Arc::new(move |fd| {
        let name = std::thread::current().name().map(str::to_owned);
        drop(fd);
        let _ = tx.lock().expect("lock").send(name);
    });
    let (stalled, stalls) = counting();
    let pool = ClosePool::with_close(close, stalled, Duration::from_millis(100));
    let closer = pool.closer(Uuid::new_v4());
    for _ in 0..20 {
        closer.close(fd());
    }
    for _ in 0..20 {
        let name = rx.recv_timeout(Duration::from_secs(5)).expect("closed");
        assert_eq!(name.as_deref(), Some("egress-close"));
    }
    assert!(pool.threads() >= 1 && pool.threads() <= MAX_CLOSERS);
    wait_for("nothing pending", || closer.pending() == 0);
    wait_for("the threads end", || pool.threads() == 0);
    assert_eq!(stalls.load(Ordering::Relaxed), 0);
    assert!(closer.refusal().is_none());
}

#[test]
fn a_stalling_desktop_holds_its_own_turns_only_and_is_counted() {
    // Descriptors of the stalling desktop are marked by being UDP sockets.
    let close: CloseFn = Arc::new(|fd: OwnedFd| {
        let udp = rustix::net::sockopt::socket_type(&fd)
            .is_ok_and(|t| t == rustix::net::SocketType::DGRAM);
        if udp {
            std::thread::sleep(Duration::from_millis(150));
        }
        drop(fd);
    });
    let (stalled, stalls) = counting();
    let pool = ClosePool::with_close(close, stalled, Duration::from_secs(10));
    let hostile = pool.closer(Uuid::new_v4());
    let other = pool.closer(Uuid::new_v4());
    let slow = || OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").expect("udp"));
    for _ in 0..(MAX_PENDING - 1) {
        hostile.close(slow());
    }
    assert!(hostile.refusal().is_none(), "under the limit");
    hostile.close(slow());
    let reason = hostile.refusal().expect("past the limit");
    assert!(
        reason.starts_with("refused: 64 connections of this desktop are still being closed"),
        "{reason}"
    );
    // The other desktop's closes go through while the first one stalls.
    let started = Instant::now();
    for _ in 0..10 {
        other.close(fd());
    }
    wait_for("the other desktop's closes", || other.pending() == 0);
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert!(other.refusal().is_none());
    // Two of the stalling desktop's closes run at once, no more.
    assert!(hostile.pending() >= MAX_PENDING - PER_DESKTOP);
    std::thread::sleep(STALLED_AFTER);
    let _ = hostile.pending();
    let counted = stalls.load(Ordering::Relaxed);
    assert!(
        (1..=PER_DESKTOP).contains(&counted),
        "{counted} stalls seen so far"
    );
    // Done in 64 × 150 ms / 2 turns, each counted once.
    let deadline = Duration::from_secs(30);
    let started = Instant::now();
    while hostile.pending() > 0 {
        assert!(started.elapsed() < deadline, "the slow closes end");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stalls.load(Ordering::Relaxed), MAX_PENDING);
    assert!(hostile.refusal().is_none(), "admitted again once closed");
}

#[test]
fn a_graceful_close_still_delivers_what_is_queued() {
    let (mut peer, ours) = tcp_pair();
    ours.set_nonblocking(true).expect("nonblocking");
    let chunk = [7u8; 65536];
    let mut queued = 0;
    loop {
        match (&ours).write(&chunk) {
            Ok(n) => queued += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    let (stalled, stalls) = counting();
    let pool = ClosePool::new(stalled);
    pool.closer(Uuid::new_v4())
        .close_gracefully(OwnedFd::from(ours));
    peer.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut got = Vec::new();
    peer.read_to_end(&mut got).expect("an orderly end");
    assert_eq!(got.len(), queued, "every queued byte arrives");
    assert_eq!(stalls.load(Ordering::Relaxed), 0);
}
