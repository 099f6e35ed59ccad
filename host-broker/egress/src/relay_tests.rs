use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
use std::time::Duration;

use dormouse_protocol::egress_policy::EgressPolicy;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::*;
use crate::resolve::{HostsFile, Resolver};
use crate::service::{Egress, Hooks};
use crate::Caps;

#[derive(Default)]
struct Seen {
    activity: AtomicUsize,
    counted: Mutex<Vec<EgressDecision>>,
    events: AtomicUsize,
}

impl Hooks for Seen {
    fn activity(&self, _: uuid::Uuid) {
        self.activity.fetch_add(1, Ordering::Relaxed);
    }
    fn counted(&self, _: uuid::Uuid, d: EgressDecision) {
        self.counted.lock().expect("lock").push(d);
    }
    fn event(&self, _: &EgressLogEntry) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

struct FakeGuest {
    io: UnixStream,
    verdicts: Arc<Mutex<Vec<Verdict>>>,
    /// A program's socket to hand over, when the guest offers one.
    program: Option<TcpStream>,
}

impl GuestStream for FakeGuest {
    async fn send_verdict(&mut self, verdict: Verdict) -> io::Result<()> {
        self.verdicts.lock().expect("lock").push(verdict);
        Ok(())
    }
    fn socket(&self) -> &UnixStream {
        &self.io
    }
    fn can_hand_over(&self) -> bool {
        self.program.is_some()
    }
    async fn take_client(
        &mut self,
        _within: Duration,
        closer: &Closer,
    ) -> io::Result<HandedSocket> {
        let program = self
            .program
            .take()
            .ok_or_else(|| io::Error::other("nothing to hand over"))?;
        let fd = std::os::fd::OwnedFd::from(program.into_std()?);
        HandedSocket::new(fd, Arc::new(closer.clone()))
    }
}

/// A connected pair on loopback: (the program's end, the proxy's end).
async fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let program = TcpStream::connect(l.local_addr().expect("addr"))
        .await
        .expect("connect");
    let (proxy, _) = l.accept().await.expect("accept");
    (program, proxy)
}

#[tokio::test]
async fn a_handed_over_socket_is_relayed_directly_counted_and_fenced() {
    let port = echo_server().await;
    let r = rig(
        &format!(r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{port}"]}}"#),
        Caps::default(),
    );
    let (mut program, proxy) = tcp_pair().await;
    let (mut session, theirs) = UnixStream::pair().expect("socket pair");
    let verdicts = Arc::new(Mutex::new(Vec::new()));
    let guest = FakeGuest {
        io: theirs,
        verdicts: verdicts.clone(),
        program: Some(proxy),
    };
    let task = tokio::spawn(serve(Arc::clone(&r.desk), open("echo.test", port), guest));
    program.write_all(b"direct").await.expect("write");
    let mut buf = [0u8; 6];
    program
        .read_exact(&mut buf)
        .await
        .expect("echo through the broker");
    assert_eq!(&buf, b"direct");
    assert_eq!(
        verdicts.lock().expect("lock").as_slice(),
        &[Verdict::HandOver]
    );
    // The session carried no byte and is closed once the socket is taken:
    // the program's socket is relayed itself.
    let mut none = [0u8; 1];
    assert_eq!(
        session.read(&mut none).await.expect("eof"),
        0,
        "the session ended"
    );
    assert!(!task.is_finished(), "the connection outlives its session");
    // A fence closes the program's connection.
    r.fence.cancel();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), program.read_to_end(&mut rest)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    task.await.expect("task");
    let e = last(&r.desk);
    assert_eq!((e.bytes_up, e.bytes_down, e.end), (6, 6, EgressEnd::Fenced));
    assert_eq!(r.desk.limiter().open(), 0, "the slot came back");
}

async fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

struct Rig {
    desk: Arc<Desk>,
    policy: watch::Sender<EgressPolicy>,
    fence: CancellationToken,
    seen: Arc<Seen>,
}

fn rig(policy: &str, caps: Caps) -> Rig {
    let seen = Arc::new(Seen::default());
    let hosts = HostsFile::parse("127.0.0.1 echo.test\n").expect("hosts");
    let egress = Arc::new(Egress::new(
        Resolver::new(hosts),
        caps,
        None,
        vec![],
        seen.clone(),
    ));
    let (tx, rx) = watch::channel(serde_json::from_str(policy).expect("policy"));
    let fence = CancellationToken::new();
    let desk = egress.desk(Uuid::new_v4(), rx, fence.clone());
    Rig {
        desk,
        policy: tx,
        fence,
        seen,
    }
}

fn open(host: &str, port: u16) -> Open {
    Open {
        host: host.into(),
        port,
        kind: EgressKind::Connect,
        head: vec![],
    }
}

/// Starts serving one connection; the test's end of the guest stream, the
/// verdicts and the task.
fn start(
    desk: &Arc<Desk>,
    o: Open,
) -> (
    UnixStream,
    Arc<Mutex<Vec<Verdict>>>,
    tokio::task::JoinHandle<()>,
) {
    let (ours, theirs) = UnixStream::pair().expect("socket pair");
    let verdicts = Arc::new(Mutex::new(Vec::new()));
    let guest = FakeGuest {
        io: theirs,
        verdicts: verdicts.clone(),
        program: None,
    };
    let task = tokio::spawn(serve(Arc::clone(desk), o, guest));
    (ours, verdicts, task)
}

fn last(desk: &Desk) -> EgressLogEntry {
    desk.log().page(None, None).entries.pop().expect("an entry")
}

#[tokio::test]
async fn an_allowed_name_is_relayed_both_ways_and_recorded() {
    let port = echo_server().await;
    let r = rig(
        &format!(r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{port}"]}}"#),
        Caps::default(),
    );
    let (mut g, verdicts, task) = start(&r.desk, open("echo.test", port));
    g.write_all(b"hello").await.expect("write");
    let mut buf = [0u8; 5];
    g.read_exact(&mut buf).await.expect("echo");
    assert_eq!(&buf, b"hello");
    g.shutdown().await.expect("half-close");
    let mut rest = Vec::new();
    g.read_to_end(&mut rest).await.expect("eof propagated back");
    task.await.expect("task");
    assert_eq!(
        verdicts.lock().expect("lock").as_slice(),
        &[Verdict::Connected]
    );
    let e = last(&r.desk);
    assert_eq!(e.decision, EgressDecision::Allowed);
    assert_eq!(
        e.rule.as_deref(),
        Some(format!("127.0.0.1/32:{port}").as_str())
    );
    assert_eq!(
        e.address.as_deref(),
        Some(format!("127.0.0.1:{port}").as_str())
    );
    assert_eq!((e.bytes_up, e.bytes_down, e.end), (5, 5, EgressEnd::Closed));
    assert_eq!(r.desk.limiter().open(), 0, "the slot came back");
}

#[tokio::test]
async fn refusals_and_failures_name_their_cause() {
    let port = echo_server().await;
    let r = rig(
        r#"{"mode":"allowlist","allow":["echo.test"]}"#,
        Caps::default(),
    );
    let (_g, verdicts, task) = start(&r.desk, open("echo.test", port));
    task.await.expect("task");
    let v = verdicts.lock().expect("lock").clone();
    assert_eq!(
        v,
        vec![Verdict::Refused(format!(
            "denied: echo.test:{port} resolves only to denied addresses (127.0.0.1 is loopback)"
        ))]
    );
    assert_eq!(last(&r.desk).rule.as_deref(), Some("echo.test"));
    for (host, port, starts) in [
        ("bad\u{7}.test", 80, "denied: invalid host `bad\\u{7}.test`"),
        (
            "other.test",
            80,
            "denied: other.test:80 not in the allow list",
        ),
        ("echo.test", 0, "denied: port 0 of echo.test"),
    ] {
        let (_g, verdicts, task) = start(&r.desk, open(host, port));
        task.await.expect("task");
        match verdicts.lock().expect("lock").as_slice() {
            [Verdict::Refused(reason)] => assert!(reason.starts_with(starts), "{reason}"),
            other => panic!("{host}: {other:?}"),
        };
    }
    // A port nobody listens on: allowed, then failed.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    r.policy.send_replace(
        serde_json::from_str(&format!(
            r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{closed}"]}}"#
        ))
        .expect("p"),
    );
    let (_g, verdicts, task) = start(&r.desk, open("echo.test", closed));
    task.await.expect("task");
    match verdicts.lock().expect("lock").as_slice() {
        [Verdict::Failed(reason)] => assert!(
            reason.starts_with(&format!("failed: connect to 127.0.0.1:{closed}")),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    };
    assert_eq!(last(&r.desk).decision, EgressDecision::Failed);
    let counted = r.seen.counted.lock().expect("lock").clone();
    assert_eq!(counted.len(), 5);
}

#[tokio::test]
async fn a_policy_change_cuts_what_it_denies_within_a_second() {
    let port = echo_server().await;
    let allow = format!(r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{port}"]}}"#);
    let r = rig(&allow, Caps::default());
    let (mut g, _v, task) = start(&r.desk, open("echo.test", port));
    g.write_all(b"x").await.expect("write");
    let mut b = [0u8; 1];
    g.read_exact(&mut b).await.expect("echo");
    // A change that still allows it leaves it open.
    let mut still: EgressPolicy = serde_json::from_str(&allow).expect("p");
    still.deny.push("other.test".parse().expect("rule"));
    r.policy.send_replace(still);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!task.is_finished());
    let cut_at = Instant::now();
    let mut denied: EgressPolicy = serde_json::from_str(&allow).expect("p");
    denied.deny.push("echo.test".parse().expect("rule"));
    r.policy.send_replace(denied);
    tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .expect("cut within 1 s")
        .expect("task");
    assert!(cut_at.elapsed() < Duration::from_secs(1));
    let mut rest = Vec::new();
    let _ = g.read_to_end(&mut rest).await;
    assert_eq!(last(&r.desk).end, EgressEnd::Policy);
}

#[tokio::test]
async fn a_fence_closes_every_open_connection() {
    let port = echo_server().await;
    let r = rig(
        &format!(r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{port}"]}}"#),
        Caps::default(),
    );
    let mut tasks = Vec::new();
    let mut guests = Vec::new();
    for _ in 0..3 {
        let (mut g, _v, task) = start(&r.desk, open("echo.test", port));
        g.write_all(b"x").await.expect("write");
        let mut b = [0u8; 1];
        g.read_exact(&mut b).await.expect("echo");
        guests.push(g);
        tasks.push(task);
    }
    assert_eq!(r.desk.limiter().open(), 3);
    r.fence.cancel();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(1), t)
            .await
            .expect("closed")
            .expect("task");
    }
    assert_eq!(last(&r.desk).end, EgressEnd::Fenced);
    assert_eq!(r.desk.limiter().open(), 0);
}

#[tokio::test(start_paused = true)]
async fn idle_connections_end_and_count_no_activity() {
    let port = echo_server().await;
    let caps = Caps {
        idle_timeout: Duration::from_secs(300),
        ..Caps::default()
    };
    let r = rig(
        &format!(r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{port}"]}}"#),
        caps,
    );
    let (_g, _v, task) = start(&r.desk, open("echo.test", port));
    task.await.expect("ended by the idle timeout");
    let e = last(&r.desk);
    assert_eq!(e.end, EgressEnd::Idle);
    assert!(e.duration_ms >= 300_000, "{}", e.duration_ms);
    assert_eq!(
        r.seen.activity.load(Ordering::Relaxed),
        0,
        "no traffic counts nothing"
    );
}

#[tokio::test]
async fn traffic_counts_as_activity_at_most_once_a_second() {
    let port = echo_server().await;
    let r = rig(
        &format!(r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{port}"]}}"#),
        Caps::default(),
    );
    let (mut g, _v, task) = start(&r.desk, open("echo.test", port));
    let started = Instant::now();
    let mut b = [0u8; 1];
    while started.elapsed() < Duration::from_millis(2500) {
        g.write_all(b"x").await.expect("write");
        g.read_exact(&mut b).await.expect("echo");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = r.seen.activity.load(Ordering::Relaxed);
    assert!((1..=3).contains(&n), "{n} activities in 2.5 s");
    drop(g);
    task.await.expect("task");
}

#[tokio::test]
async fn the_caps_refuse_beyond_them() {
    let port = echo_server().await;
    let caps = Caps {
        max_open: 2,
        per_second: 1000,
        ..Caps::default()
    };
    let r = rig(
        &format!(r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{port}"]}}"#),
        caps,
    );
    let mut held = Vec::new();
    for _ in 0..2 {
        let (mut g, _v, task) = start(&r.desk, open("echo.test", port));
        g.write_all(b"x").await.expect("write");
        let mut b = [0u8; 1];
        g.read_exact(&mut b).await.expect("echo");
        held.push((g, task));
    }
    let (_g, verdicts, task) = start(&r.desk, open("echo.test", port));
    task.await.expect("task");
    assert_eq!(
        verdicts.lock().expect("lock").as_slice(),
        &[Verdict::Refused(
            "refused: 2 connections are open from this desktop, the most it may".into()
        )]
    );
}

#[tokio::test]
async fn a_desktop_whose_closes_are_stuck_gets_no_new_connection() {
    let port = echo_server().await;
    let seen = Arc::new(Seen::default());
    let stuck = crate::closer::ClosePool::with_close(
        Arc::new(|fd| {
            std::thread::sleep(Duration::from_secs(1));
            drop(fd);
        }),
        Arc::new(|_| {}),
        Duration::from_secs(10),
    );
    let hosts = HostsFile::parse("127.0.0.1 echo.test\n").expect("hosts");
    let egress = Arc::new(
        Egress::new(Resolver::new(hosts), Caps::default(), None, vec![], seen).with_closes(stuck),
    );
    let policy = format!(r#"{{"mode":"allowlist","allow":["127.0.0.1/32:{port}"]}}"#);
    let (_tx, rx) = watch::channel(serde_json::from_str(&policy).expect("policy"));
    let desk = egress.desk(Uuid::new_v4(), rx, CancellationToken::new());
    for _ in 0..crate::closer::MAX_PENDING {
        let (_program, proxy) = tcp_pair().await;
        desk.closer()
            .close(std::os::fd::OwnedFd::from(proxy.into_std().expect("std")));
    }
    let (_g, verdicts, task) = start(&desk, open("echo.test", port));
    task.await.expect("task");
    let v = verdicts.lock().expect("lock").clone();
    assert!(
        matches!(v.as_slice(), [Verdict::Refused(r)] if r.starts_with("refused: 64 connections of this desktop are still being closed")),
        "{v:?}"
    );
    assert_eq!(desk.limiter().open(), 0, "no slot taken");
}
