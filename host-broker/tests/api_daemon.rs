//! The `dormoused` binary as systemd and an operator meet it: a private data
//! directory and token, `READY=1` only once it serves, watchdog pings,
//! SIGHUP re-reading the token, SIGTERM stopping cleanly, a unix socket and
//! a systemd-passed socket, and refusals that exit with an error.
//!
//! The engine is a dead socket (`DOCKER_HOST` naming a socket file nobody
//! listens on), so these tests need no Docker and touch no container: the
//! broker must start and serve without an engine, answering 503 where one
//! is needed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A bound on hangs, not a speed claim.
const PATIENCE: Duration = Duration::from_secs(30);

struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
    notifications: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dormoused.log")).unwrap_or_default()
    }

    fn notified(&self) -> Vec<String> {
        self.notifications.lock().expect("lock").clone()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name}");
    }

    fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "dormoused did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_for(&self, what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !check() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A socket file nobody listens on: the engine is "down".
fn dead_engine(dir: &Path) -> String {
    let path = dir.join("engine.sock");
    drop(UnixListener::bind(&path).expect("bind the dead engine socket"));
    format!("unix://{}", path.display())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Starts dormoused with `args` (after `--data-dir`), a notify socket and,
/// when `watchdog`, a watchdog interval. `wrap` runs it under another
/// program (e.g. systemd-socket-activate).
fn spawn(args: &[&str], watchdog: bool, wrap: &[&str]) -> Daemon {
    let dir = tempfile::tempdir().expect("tempdir");
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
    notify
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let notifications = Arc::new(Mutex::new(Vec::new()));
    let sink = notifications.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        loop {
            match notify.recv(&mut buf) {
                Ok(n) => sink
                    .lock()
                    .expect("lock")
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Arc::strong_count(&sink) == 1 {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    let log = std::fs::File::create(dir.path().join("dormoused.log")).expect("log file");
    let data_dir = dir.path().join("data");
    let mut argv: Vec<std::ffi::OsString> = wrap.iter().map(Into::into).collect();
    if !wrap.is_empty() {
        // systemd-socket-activate passes only the variables it is told to.
        for var in ["DOCKER_HOST", "NOTIFY_SOCKET"] {
            argv.push("-E".into());
            argv.push(var.into());
        }
    }
    argv.push(env!("CARGO_BIN_EXE_dormoused").into());
    argv.push("--data-dir".into());
    argv.push(data_dir.into());
    argv.extend(args.iter().map(Into::into));
    let mut command = if watchdog {
        // systemd sets WATCHDOG_PID to the daemon's own pid, which only a
        // shell that execs into it knows in advance.
        let mut c = Command::new("sh");
        c.args(["-c", "WATCHDOG_PID=$$ exec \"$@\"", "sh"])
            .args(&argv)
            .env("WATCHDOG_USEC", "400000");
        c
    } else {
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    };
    command
        .env("DOCKER_HOST", dead_engine(dir.path()))
        .env("NOTIFY_SOCKET", &notify_path)
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .env_remove("WATCHDOG_PID")
        .env_remove("RUST_LOG")
        .env_remove("DORMOUSE_LOG")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    let child = command.spawn().expect("spawn dormoused");
    Daemon {
        child,
        dir,
        notifications,
    }
}

/// A plain HTTP/1.1 exchange; returns (status, body).
fn http(
    stream: &mut dyn ReadWrite,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: dormouse\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read reply");
    let status = reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

trait ReadWrite: std::io::Read + std::io::Write {}
impl<T: std::io::Read + std::io::Write> ReadWrite for T {}

fn tcp(port: u16, method: &str, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(PATIENCE)).ok()?;
    Some(http(&mut stream, method, path, token))
}

fn read_token(d: &Daemon) -> Option<String> {
    std::fs::read_to_string(d.data_dir().join("token"))
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
}

#[test]
fn first_start_serves_notifies_reloads_and_stops_cleanly() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut d = spawn(&["--listen", &listen, "--image", "none"], true, &[]);
    d.wait_for("READY=1", || {
        d.notified().iter().any(|m| m.contains("READY=1"))
    });
    // READY only once the API answers: a request now must succeed.
    let (status, body) = tcp(port, "GET", "/healthz", None).expect("serving at READY");
    assert_eq!(status, 200);
    assert!(body.starts_with("ok\n"), "{body:?}");
    let ready = d
        .notified()
        .into_iter()
        .find(|m| m.contains("READY=1"))
        .expect("ready");
    assert!(
        ready.contains(&format!("STATUS=serving on http://{listen}")),
        "{ready}"
    );

    // A private data directory and token.
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&d.data_dir()), 0o700);
    assert_eq!(mode(&d.data_dir().join("token")), 0o600);
    let token = read_token(&d).expect("token");
    assert_eq!(token.len(), 64);
    assert!(!d.log().contains(&token), "the token is never logged");

    assert_eq!(
        tcp(port, "GET", "/v1/computers", None).map(|r| r.0),
        Some(401)
    );
    assert_eq!(
        tcp(port, "GET", "/v1/computers", Some(&token)).map(|r| r.0),
        Some(200)
    );
    // No engine: the broker keeps serving and says so.
    assert_eq!(
        tcp(port, "POST", "/v1/computers", Some(&token)).map(|r| r.0),
        Some(503)
    );

    // The watchdog is pinged.
    d.wait_for("watchdog pings", || {
        d.notified()
            .iter()
            .filter(|m| m.contains("WATCHDOG=1"))
            .count()
            >= 3
    });

    // SIGHUP re-reads a rotated token.
    let rotated = "f".repeat(64);
    let path = d.data_dir().join("token");
    std::fs::write(&path, format!("{rotated}\n")).expect("rotate");
    d.signal("HUP");
    d.wait_for("the rotated token", || {
        tcp(port, "GET", "/v1/computers", Some(&rotated)).map(|r| r.0) == Some(200)
    });
    assert_eq!(
        tcp(port, "GET", "/v1/computers", Some(&token)).map(|r| r.0),
        Some(401)
    );
    assert!(d.notified().iter().any(|m| m.contains("RELOADING=1")));

    // A token file others can read is refused on reload; the old one stays.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::fs::write(&path, format!("{}\n", "e".repeat(64))).expect("write");
    d.signal("HUP");
    d.wait_for("the refusal in the log", || {
        d.log().contains("keeping the current token")
    });
    assert_eq!(
        tcp(port, "GET", "/v1/computers", Some(&rotated)).map(|r| r.0),
        Some(200)
    );

    d.signal("TERM");
    let status = d.wait_exit();
    assert_eq!(status.code(), Some(0), "clean stop; log:\n{}", d.log());
    assert!(d.notified().iter().any(|m| m.contains("STOPPING=1")));
    assert!(d.log().contains("desktops keep running"));
}

#[test]
fn unix_socket_listener() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("api.sock");
    let listen = format!("unix:{}", socket.display());
    let mut d = spawn(
        &[
            "--listen",
            &listen,
            "--image",
            "none",
            "--header-timeout",
            "1s",
        ],
        false,
        &[],
    );
    d.wait_for("READY=1", || {
        d.notified().iter().any(|m| m.contains("READY=1"))
    });
    let meta = std::fs::symlink_metadata(&socket).expect("socket exists");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = read_token(&d).expect("token");
    let mut stream = UnixStream::connect(&socket).expect("connect");
    let (status, body) = http(&mut stream, "GET", "/v1/computers", Some(&token));
    assert_eq!((status, body.trim()), (200, "[]"));
    // The head deadline holds on a unix socket too.
    let mut silent = UnixStream::connect(&socket).expect("connect");
    silent.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut silent, &mut rest);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a silent unix connection stayed open {:?}",
        started.elapsed()
    );
    d.signal("TERM");
    assert_eq!(d.wait_exit().code(), Some(0));
    assert!(
        !socket.exists(),
        "the socket file is removed on a clean stop"
    );
}

#[test]
fn socket_activation() {
    let Some(activate) = [
        "/usr/bin/systemd-socket-activate",
        "/bin/systemd-socket-activate",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists()) else {
        eprintln!("SKIPPED: systemd-socket-activate is not installed (package systemd)");
        return;
    };
    let port = free_port();
    let activated = format!("127.0.0.1:{port}");
    let ignored = format!("127.0.0.1:{}", free_port());
    let mut d = spawn(
        &[
            "--listen",
            &ignored,
            "--image",
            "none",
            "--header-timeout",
            "1s",
        ],
        false,
        &[activate, "-l", &activated],
    );
    // The first connection starts the broker; it is answered once it serves.
    let mut answer = None;
    d.wait_for("the activated socket", || {
        answer = tcp(port, "GET", "/healthz", None);
        answer.is_some()
    });
    assert_eq!(answer.map(|a| a.0), Some(200));
    // The activated socket is served under the same limits.
    let mut silent = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    silent.set_read_timeout(Some(PATIENCE)).expect("timeout");
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut silent, &mut rest);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "a silent connection stayed open {:?}",
        started.elapsed()
    );
    d.wait_for("READY=1", || {
        d.notified().iter().any(|m| m.contains("READY=1"))
    });
    assert!(d.log().contains("socket_activated=true"), "{}", d.log());
    assert!(tcp(
        ignored
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port"),
        "GET",
        "/healthz",
        None
    )
    .is_none());
    d.signal("TERM");
    assert_eq!(d.wait_exit().code(), Some(0));
}

#[test]
fn refusals_exit_with_an_error() {
    // Not loopback, no --allow-remote.
    let mut d = spawn(&["--listen", "0.0.0.0:0", "--image", "none"], false, &[]);
    let status = d.wait_exit();
    assert_eq!(status.code(), Some(1));
    assert!(d.log().contains("not a loopback address"), "{}", d.log());
    assert!(!d.notified().iter().any(|m| m.contains("READY=1")));

    // A token file others can read.
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    let token = data.join("token");
    std::fs::write(&token, "a".repeat(64)).expect("write");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let output = Command::new(env!("CARGO_BIN_EXE_dormoused"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--image", "none"])
        .env("DOCKER_HOST", dead_engine(dir.path()))
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("readable by its owner only"));

    // A token file reached through a symbolic link.
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&elsewhere, "a".repeat(64)).expect("write");
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::symlink(&elsewhere, data.join("token")).expect("symlink");
    let output = Command::new(env!("CARGO_BIN_EXE_dormoused"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--image", "none"])
        .env("DOCKER_HOST", dead_engine(dir.path()))
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is a symbolic link"), "{stderr}");

    // Usage errors exit 2.
    let output = Command::new(env!("CARGO_BIN_EXE_dormoused"))
        .args(["--idle-timeout", "10ms"])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
}

/// How a slow client behaves after connecting.
#[derive(Debug, Clone, Copy)]
enum Slow {
    /// Sends the start of a request line, then nothing.
    PartialLine,
    /// Sends a request line, then its headers one byte every few seconds.
    TrickledHeaders,
    /// Connects and sends nothing.
    Silent,
    /// One complete request on a kept-alive connection, then nothing.
    IdleKeepAlive,
}

/// Runs `slow` against `addr` and returns how long after connecting the
/// broker closed the connection (`None`: still open after `bound`), and
/// what it sent.
fn time_to_close(port: u16, slow: Slow, bound: Duration) -> (Option<Duration>, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let started = Instant::now();
    let trickle = b"Host: dormouse\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut sent = 0;
    let mut last_byte = started;
    match slow {
        Slow::PartialLine => stream.write_all(b"GET /v1/comp").expect("send"),
        Slow::TrickledHeaders => stream
            .write_all(b"GET /healthz HTTP/1.1\r\n")
            .expect("send"),
        Slow::Silent => {}
        Slow::IdleKeepAlive => stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: dormouse\r\n\r\n")
            .expect("send"),
    }
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    while started.elapsed() < bound {
        match stream.read(&mut buf) {
            Ok(0) => return (Some(started.elapsed()), lossy(&received)),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (Some(started.elapsed()), lossy(&received)),
        }
        if matches!(slow, Slow::TrickledHeaders)
            && sent < trickle.len() - 4
            && last_byte.elapsed() >= Duration::from_secs(3)
        {
            last_byte = Instant::now();
            if stream.write_all(&trickle[sent..=sent]).is_err() {
                return (Some(started.elapsed()), lossy(&received));
            }
            sent += 1;
        }
    }
    (None, lossy(&received))
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Token-less slow clients (the slowloris family) are closed by the header
/// deadline (10 s by default), whatever they send and however slowly.
#[test]
fn slow_clients_are_closed_within_the_header_timeout() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = spawn(&["--listen", &listen, "--image", "none"], false, &[]);
    d.wait_for("READY=1", || {
        d.notified().iter().any(|m| m.contains("READY=1"))
    });
    let header_timeout = Duration::from_secs(10);
    let bound = header_timeout + Duration::from_secs(10);
    let clients = [
        Slow::PartialLine,
        Slow::TrickledHeaders,
        Slow::Silent,
        Slow::IdleKeepAlive,
    ];
    let handles: Vec<_> = clients
        .into_iter()
        .map(|slow| std::thread::spawn(move || (slow, time_to_close(port, slow, bound))))
        .collect();
    for handle in handles {
        let (slow, (closed, received)) = handle.join().expect("client thread");
        let closed = closed.unwrap_or_else(|| {
            panic!("{slow:?}: still open after {bound:?}; received {received:?}")
        });
        eprintln!(
            "{slow:?}: closed by the broker after {:.2} s",
            closed.as_secs_f64()
        );
        assert!(
            closed <= header_timeout + Duration::from_secs(2),
            "{slow:?}: closed only after {closed:?}"
        );
        if matches!(slow, Slow::IdleKeepAlive) {
            assert!(received.starts_with("HTTP/1.1 200"), "{received:?}");
        }
    }
}

/// A request whose body trickles in is answered 408 at the body deadline
/// and its connection closed.
#[test]
fn a_trickled_body_is_refused_at_the_body_timeout() {
    use std::io::{Read as _, Write as _};
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = spawn(
        &[
            "--listen",
            &listen,
            "--image",
            "none",
            "--body-timeout",
            "4s",
        ],
        false,
        &[],
    );
    d.wait_for("READY=1", || {
        d.notified().iter().any(|m| m.contains("READY=1"))
    });
    let token = read_token(&d).expect("token");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    write!(
        stream,
        "POST /v1/computers HTTP/1.1\r\nHost: dormouse\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    )
    .expect("send head");
    let started = Instant::now();
    let mut last = started;
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still open; received {:?}",
            lossy(&received)
        );
        match stream.read(&mut buf) {
            Ok(0) => break started.elapsed(),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break started.elapsed(),
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            let _ = stream.write_all(b" ");
        }
    };
    let received = lossy(&received);
    eprintln!(
        "trickled body: answered and closed after {:.2} s",
        closed.as_secs_f64()
    );
    assert!(received.starts_with("HTTP/1.1 408"), "{received}");
    assert!(received.contains("request_timeout"), "{received}");
    assert!(closed <= Duration::from_secs(6), "closed after {closed:?}");
}

/// Beyond `--max-connections`, new connections wait (in the listen backlog)
/// until one closes: with 4 silent connections holding the cap, 2 complete
/// requests are not served until the header deadline frees the slots, and
/// the broker says once that the cap was reached.
#[test]
fn the_connection_cap_holds() {
    use std::io::{Read as _, Write as _};
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = spawn(
        &[
            "--listen",
            &listen,
            "--image",
            "none",
            "--max-connections",
            "4",
            "--header-timeout",
            "4s",
        ],
        false,
        &[],
    );
    d.wait_for("READY=1", || {
        d.notified().iter().any(|m| m.contains("READY=1"))
    });
    let started = Instant::now();
    let holders: Vec<_> = (0..4)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect"))
        .collect();
    // Let the broker accept all four before the others arrive.
    std::thread::sleep(Duration::from_millis(300));
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
                s.set_read_timeout(Some(PATIENCE)).expect("timeout");
                s.write_all(
                    b"GET /healthz HTTP/1.1\r\nHost: dormouse\r\nConnection: close\r\n\r\n",
                )
                .expect("send");
                let mut reply = String::new();
                let _ = s.read_to_string(&mut reply);
                (started.elapsed(), reply)
            })
        })
        .collect();
    for handle in waiting {
        let (served, reply) = handle.join().expect("client");
        eprintln!(
            "request beyond the cap served after {:.2} s",
            served.as_secs_f64()
        );
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply:?}");
        assert!(
            served >= Duration::from_millis(3500),
            "served after {served:?}, while the cap was held"
        );
        assert!(served <= Duration::from_secs(8), "served after {served:?}");
    }
    drop(holders);
    assert_eq!(
        d.log().matches("connection cap reached").count(),
        1,
        "{}",
        d.log()
    );
}

/// An empty token file (an interrupted first start of an older broker) does
/// not block the start: it is replaced by a whole new token.
#[test]
fn an_empty_token_file_is_replaced_at_start() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut d = spawn(&["--listen", &listen, "--image", "none"], false, &[]);
    d.wait_for("READY=1", || {
        d.notified().iter().any(|m| m.contains("READY=1"))
    });
    d.signal("TERM");
    assert_eq!(d.wait_exit().code(), Some(0));
    let path = d.data_dir().join("token");
    let engine_dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(&path, "").expect("truncate the token");
    let output = Command::new(env!("CARGO_BIN_EXE_dormoused"))
        .arg("--data-dir")
        .arg(d.data_dir())
        .args(["--listen", &listen, "--image", "none"])
        .env("DOCKER_HOST", dead_engine(engine_dir.path()))
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let mut second = DropKill(output);
    let mut token = None;
    d.wait_for("a new token and an answer", || {
        token = read_token(&d);
        token
            .as_ref()
            .is_some_and(|t| tcp(port, "GET", "/v1/computers", Some(t)).map(|r| r.0) == Some(200))
    });
    assert_eq!(token.map(|t| t.len()), Some(64));
    assert_eq!(
        std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777,
        0o600
    );
    let _ = second.0.kill();
    let _ = second.0.wait();
}

struct DropKill(Child);

impl Drop for DropKill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client that pipelines requests and never reads the answers cannot hold
/// its connection: once the socket buffers are full, the broker's write
/// stalls, and after 30 s it gives up and closes, so fewer answers than
/// requests ever arrive.
#[test]
fn a_client_that_never_reads_is_dropped_after_a_stalled_write() {
    use std::io::{Read as _, Write as _};
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = spawn(&["--listen", &listen, "--image", "none"], false, &[]);
    d.wait_for("READY=1", || {
        d.notified().iter().any(|m| m.contains("READY=1"))
    });
    let token = read_token(&d).expect("token");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let request = format!(
        "GET /v1/openapi.json HTTP/1.1\r\nHost: dormouse\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    // About 40 MB of answers, far more than loopback socket buffers hold.
    let requests = 1000;
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut sent = 0;
    for _ in 0..requests {
        if stream.write_all(request.as_bytes()).is_err() {
            break;
        }
        sent += 1;
    }
    std::thread::sleep(Duration::from_secs(36));
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut received = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let ended = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    let answers = lossy(&received).matches("HTTP/1.1 200").count();
    eprintln!(
        "sent {sent} requests, never read for 36 s: {answers} answers arrived, then the \
         connection {}",
        if ended { "was closed" } else { "stayed open" }
    );
    assert!(ended, "the broker closed the connection");
    assert!(
        answers < sent,
        "{answers} of {sent}: the broker kept writing"
    );
}

/// Text with a line break in it (here a data directory's name, in the
/// starting line) is logged escaped: it cannot forge a second log line.
#[test]
fn logged_text_cannot_forge_a_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let forged = "INFO dormouse::access: request method=DELETE status=204 FORGED";
    let data = dir.path().join(format!("data\n{forged}\u{202e}"));
    let log_path = dir.path().join("log");
    let log = std::fs::File::create(&log_path).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_dormoused"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--listen", "127.0.0.1:0", "--image", "none"])
        .env("DOCKER_HOST", dead_engine(dir.path()))
        .env_remove("RUST_LOG")
        .env_remove("DORMOUSE_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn");
    let mut child = DropKill(child);
    let deadline = Instant::now() + PATIENCE;
    let text = loop {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        if text.contains("dormoused ready") {
            break text;
        }
        assert!(Instant::now() < deadline, "not ready:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.0.kill();
    for line in text.lines() {
        assert!(!line.starts_with(forged), "a forged line:\n{text}");
        assert!(!line.contains('\u{202e}'), "a raw bidi override:\n{text}");
    }
    assert!(
        text.contains(&format!("data\\n{forged}\\u{{202e}}")),
        "{text}"
    );
}
