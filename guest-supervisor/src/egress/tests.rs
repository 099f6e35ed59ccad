use super::*;
use dormouse_protocol::egress::{write_verdict, EgressVerdict};
use dormouse_protocol::stream::{read_frame, ReadLimits};
use dormouse_protocol::Response;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::UnixStream;

const IO: Duration = Duration::from_secs(5);

/// A proxy on an ephemeral loopback port and its hub.
async fn proxy(max_clients: usize) -> (SocketAddr, Hub, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hub = Hub::new();
    let task = tokio::spawn(serve_on(vec![listener], hub.clone(), max_clients));
    while hub.park().is_err_and(|e| e == ParkError::NotServing) {
        tokio::task::yield_now().await;
    }
    (addr, hub, task)
}

/// Parks one connection the way the dispatcher does; returns the broker's
/// end.
fn park(hub: &Hub) -> UnixStream {
    let (broker, guest) = UnixStream::pair().unwrap();
    let hub = hub.clone();
    tokio::spawn(async move {
        let (mut rd, mut wr) = guest.into_split();
        session::serve(&hub, &mut rd, &mut wr, IO, || {}).await;
    });
    broker
}

async fn until_parked(hub: &Hub, n: usize) {
    for _ in 0..1000 {
        if hub.parked() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("never parked");
}

async fn open_frame(broker: &mut UnixStream) -> (EgressOpen, Vec<u8>) {
    let limits = ReadLimits::new(Some(IO), IO);
    let frame = read_frame::<Response, _>(broker, &limits).await.unwrap();
    let Response::EgressOpen(open) = frame.message else {
        panic!("{:?}", frame.message);
    };
    (open, frame.payload)
}

async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(request).await.unwrap();
    let mut out = Vec::new();
    client.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn plain_http_is_opened_on_the_oldest_parked_connection_and_relayed() {
    // The hub's probe above parked nothing: start from a clean count.
    let (addr, hub, _task) = proxy(8).await;
    let mut first = park(&hub);
    until_parked(&hub, 1).await;
    let mut second = park(&hub);
    until_parked(&hub, 2).await;
    let client = tokio::spawn(exchange(
        addr,
        b"GET http://site.invalid:8080/page HTTP/1.1\r\nHost: x\r\nProxy-Connection: keep-alive\r\n\r\n",
    ));
    let (open, payload) = open_frame(&mut first).await;
    assert_eq!((open.host.as_str(), open.port), ("site.invalid", 8080));
    assert_eq!(
        open.form,
        EgressForm::Http {
            method: "GET".into()
        }
    );
    assert_eq!(
        String::from_utf8(payload).unwrap(),
        "GET /page HTTP/1.1\r\nHost: site.invalid:8080\r\nConnection: close\r\n\r\n"
    );
    write_verdict(&mut first, &EgressVerdict::Connected, IO)
        .await
        .unwrap();
    first
        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        .await
        .unwrap();
    first.shutdown().await.unwrap();
    let got = client.await.unwrap();
    assert_eq!(got, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
    // The client's end reached the broker as the end of the pipe.
    let mut rest = Vec::new();
    first.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    // The second stays parked for the next client.
    let client = tokio::spawn(exchange(addr, b"CONNECT a.b:443 HTTP/1.1\r\n\r\n"));
    let (open, payload) = open_frame(&mut second).await;
    assert_eq!(
        (open.host.as_str(), open.port, open.form),
        ("a.b", 443, EgressForm::Connect)
    );
    assert!(payload.is_empty());
    assert!(open.id > 0);
    write_verdict(&mut second, &EgressVerdict::Connected, IO)
        .await
        .unwrap();
    second.write_all(b"tunnel bytes").await.unwrap();
    drop(second);
    let got = client.await.unwrap();
    assert_eq!(
        got,
        "HTTP/1.1 200 Connection established\r\n\r\ntunnel bytes"
    );
}

#[tokio::test]
async fn refusals_and_failures_reach_the_client() {
    let (addr, hub, _task) = proxy(8).await;
    let mut broker = park(&hub);
    let client = tokio::spawn(exchange(addr, b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n"));
    let _ = open_frame(&mut broker).await;
    let reason = "denied: pypi.org:443 not in the allow list".to_string();
    write_verdict(&mut broker, &EgressVerdict::Refused { reason }, IO)
        .await
        .unwrap();
    let got = client.await.unwrap();
    assert!(got.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{got}");
    let (_, body) = got.split_once("\r\n\r\n").unwrap();
    assert!(
        body.starts_with("denied: pypi.org:443 not in the allow list\n"),
        "{got}"
    );
    // And how to let it through, exactly as the host's CLI takes it.
    assert!(body.contains(" allow pypi.org:443 "), "{got}");

    // Egress off: the page a browser shows says how to open it.
    let mut broker = park(&hub);
    let client = tokio::spawn(exchange(addr, b"GET http://a.b/ HTTP/1.1\r\n\r\n"));
    let _ = open_frame(&mut broker).await;
    let reason = "denied: egress is off for this desktop".to_string();
    write_verdict(&mut broker, &EgressVerdict::Refused { reason }, IO)
        .await
        .unwrap();
    let got = client.await.unwrap();
    let (_, page) = got.split_once("\r\n\r\n").unwrap();
    assert!(
        page.contains("<pre") && page.contains(" egress is off"),
        "{got}"
    );
    assert!(
        page.contains(" open (or allow only this destination: "),
        "{got}"
    );
    assert!(page.contains(" allow a.b:80)"), "{got}");

    let mut broker = park(&hub);
    let client = tokio::spawn(exchange(addr, b"GET http://a.b/ HTTP/1.1\r\n\r\n"));
    let _ = open_frame(&mut broker).await;
    let reason = "denied: a.b:80 not in the allow list".to_string();
    write_verdict(&mut broker, &EgressVerdict::Refused { reason }, IO)
        .await
        .unwrap();
    let got = client.await.unwrap();
    assert!(got.contains("text/html") && got.contains("<pre"), "{got}");
    assert!(
        got.contains("denied: a.b:80 not in the allow list"),
        "{got}"
    );

    let mut broker = park(&hub);
    let client = tokio::spawn(exchange(addr, b"CONNECT a.b:443 HTTP/1.1\r\n\r\n"));
    let _ = open_frame(&mut broker).await;
    let reason = "connection refused by 127.0.0.1:443".to_string();
    write_verdict(&mut broker, &EgressVerdict::Failed { reason }, IO)
        .await
        .unwrap();
    let got = client.await.unwrap();
    assert!(got.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{got}");
    assert!(got.contains("connection refused by 127.0.0.1:443"), "{got}");

    // A broker that hangs up instead of answering: 502, never a hang.
    let mut broker = park(&hub);
    let client = tokio::spawn(exchange(addr, b"CONNECT a.b:443 HTTP/1.1\r\n\r\n"));
    let _ = open_frame(&mut broker).await;
    drop(broker);
    let got = client.await.unwrap();
    assert!(got.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{got}");
}

#[tokio::test]
async fn bad_requests_are_answered_without_the_broker() {
    let (addr, _hub, _task) = proxy(8).await;
    let got = exchange(addr, b"CONNECT a.b:70000 HTTP/1.1\r\n\r\n").await;
    assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{got}");
    assert!(got.contains("invalid port"), "{got}");
    let got = exchange(addr, b"GET / HTTP/1.1\r\nHost: a.b\r\n\r\n").await;
    assert!(got.starts_with("HTTP/1.1 400 "), "{got}");
}

#[tokio::test]
async fn without_a_parked_connection_the_client_gets_503() {
    let (addr, _hub, _task) = proxy(8).await;
    let got = exchange(addr, b"CONNECT a.b:443 HTTP/1.1\r\n\r\n").await;
    assert!(got.starts_with("HTTP/1.1 503 "), "{got}");
    assert!(got.contains("the broker is not connected"), "{got}");
}

#[tokio::test]
async fn clients_over_the_cap_get_503_at_once() {
    let (addr, _hub, _task) = proxy(2).await;
    // Two clients that never finish their head hold both places.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET http://a.b/").await.unwrap();
        held.push(c);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    // The answer is written on accept, before the client's request is
    // read (a client that already sent one may see a reset instead).
    let mut over = TcpStream::connect(addr).await.unwrap();
    let mut got = Vec::new();
    over.read_to_end(&mut got).await.unwrap();
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 503 "), "{got}");
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(held);
}

#[tokio::test]
async fn parking_is_refused_when_not_serving_and_when_full() {
    let hub = Hub::new();
    assert_eq!(hub.park().unwrap_err(), ParkError::NotServing);
    hub.set_serving(true);
    let parked: Vec<_> = (0..MAX_PARKED).map(|_| hub.park().unwrap()).collect();
    assert_eq!(hub.park().unwrap_err(), ParkError::Full);
    drop(parked);
    // Gone receivers free their places.
    assert!(hub.park().is_ok());
    // The refusal reaches the broker as an error frame.
    let hub = Hub::new();
    let (mut broker, guest) = UnixStream::pair().unwrap();
    let (mut rd, mut wr) = guest.into_split();
    let mut released = false;
    session::serve(&hub, &mut rd, &mut wr, IO, || released = true).await;
    assert!(
        !released,
        "a refused connection keeps its slot until it closes"
    );
    let limits = ReadLimits::new(Some(IO), IO);
    let frame = read_frame::<Response, _>(&mut broker, &limits)
        .await
        .unwrap();
    assert_eq!(frame.message.kind(), "error");
    assert!(
        matches!(frame.message, Response::Error { ref code, .. } if code == "egress_unavailable")
    );
}

#[tokio::test]
async fn a_parked_connection_the_broker_closes_is_dropped() {
    let (addr, hub, _task) = proxy(8).await;
    let gone = park(&hub);
    until_parked(&hub, 1).await;
    drop(gone);
    let mut live = park(&hub);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let client = tokio::spawn(exchange(addr, b"CONNECT a.b:443 HTTP/1.1\r\n\r\n"));
    let (open, _) = open_frame(&mut live).await;
    assert_eq!(open.host, "a.b");
    write_verdict(&mut live, &EgressVerdict::Failed { reason: "x".into() }, IO)
        .await
        .unwrap();
    assert!(client.await.unwrap().starts_with("HTTP/1.1 502 "));
}

#[tokio::test]
async fn a_connect_client_is_answered_then_handed_over_as_its_own_socket() {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::{AsRawFd as _, FromRawFd as _};
    let (addr, hub, _task) = proxy(8).await;
    let mut broker = park(&hub);
    let mut client = TcpStream::connect(addr).await.unwrap();
    client
        .write_all(b"CONNECT a.b:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let (open, _) = open_frame(&mut broker).await;
    assert!(open.hand_over, "the supervisor offers its client's socket");
    write_verdict(&mut broker, &EgressVerdict::HandOver, IO)
        .await
        .unwrap();
    // One byte with one descriptor: the program's connection itself.
    let (bytes, fds) = loop {
        broker.readable().await.unwrap();
        let got = broker.try_io(tokio::io::Interest::READABLE, || {
            let mut byte = [0u8; 1];
            let mut iov = [std::io::IoSliceMut::new(&mut byte)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let msg = recvmsg::<()>(
                broker.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_DONTWAIT,
            )
            .map_err(std::io::Error::from)?;
            let fds: Vec<_> = msg
                .cmsgs()
                .map_err(std::io::Error::from)?
                .filter_map(|c| match c {
                    ControlMessageOwned::ScmRights(fds) => Some(fds),
                    _ => None,
                })
                .flatten()
                .collect();
            Ok((msg.bytes, fds))
        });
        match got {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => break other.unwrap(),
        }
    };
    assert_eq!((bytes, fds.len()), (1, 1));
    // SAFETY: the descriptor was just received and is owned by nothing else.
    let handed = unsafe { std::net::TcpStream::from_raw_fd(fds[0]) };
    handed.set_nonblocking(true).unwrap();
    let mut handed = TcpStream::from_std(handed).unwrap();
    handed.write_all(b"straight from the broker").await.unwrap();
    handed.shutdown().await.unwrap();
    let mut got = Vec::new();
    client.read_to_end(&mut got).await.unwrap();
    assert_eq!(
        String::from_utf8(got).unwrap(),
        "HTTP/1.1 200 Connection established\r\n\r\nstraight from the broker"
    );
    // The session stays until the broker ends it; then it is released.
    assert_eq!(hub.parked(), 0);
    drop(broker);
}
