//! The supervisor as PID 1 of a real desktop container (Docker).
//!
//! Every container runs hardened as the broker runs it: `--network none`,
//! `--cap-drop ALL` plus only [`REQUIRED_CAPABILITIES`],
//! `no-new-privileges`, private IPC and cgroup namespaces, the workspace as
//! a bind mount. The tests skip visibly without Docker or without the image
//! (and fail under `CI=true`). Numbers (RSS, start → X ready, stop time) are
//! printed, never asserted tightly: run with `--nocapture` to see them.
//!
//! `DORMOUSE_TEST_SUPERVISOR_BIN=<path>` bind-mounts another supervisor
//! binary over the image's (for iterating without rebuilding the image).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dormouse_e2e::{
    desktop_image, docker, docker_available, docker_ok, unique_name, ContainerGuard, TempDir,
    TEST_LABEL,
};
use dormouse_protocol::{frame, Request, Response, ServiceRunState};
use dormouse_supervisor::REQUIRED_CAPABILITIES;
use std::os::unix::net::UnixStream;

/// Bound for waits on the desktop; generous, since the machine is shared.
const WAIT: Duration = Duration::from_secs(60);

/// A tiny HTTP server for the guest (it has perl, no python or curl):
/// `/set/<v>` sets a persistent cookie `dormouse=<v>` (its page then loads
/// `/loaded`, so the cookie is stored once that request comes), anything
/// else echoes the Cookie header as `cookie=[...]`. Every request path is
/// appended to the file named by the second argument.
const COOKIE_SERVER: &str = r#"
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $ARGV[0], Listen => 8, ReuseAddr => 1) or die "listen: $!";
while (my $c = $s->accept) {
  my $req = <$c>; my $cookie = '';
  while (my $l = <$c>) { last if $l =~ /^\r?\n$/; $cookie = $1 if $l =~ /^Cookie:\s*(.*?)\r?\n$/i; }
  my ($path) = $req =~ m{^GET (\S+)};
  if (open(my $log, '>>', $ARGV[1])) { print $log "$path\n"; close $log; }
  my $extra = ''; my $body;
  if ($path =~ m{^/set/(\w+)}) { $extra = "Set-Cookie: dormouse=$1; Max-Age=31536000; Path=/\r\n"; $body = "<html><body>set<img src=\"/loaded\"></body></html>"; }
  else { $body = "<html><body>cookie=[$cookie]</body></html>"; }
  print $c "HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n${extra}Content-Length: " . length($body) . "\r\nConnection: close\r\n\r\n$body";
  close $c;
}
"#;

/// One desktop container under test, removed on drop.
struct Desktop {
    name: String,
    workspace: TempDir,
    /// The host side of `/run/dormouse`, as the broker mounts it.
    run_dir: TempDir,
    _guard: ContainerGuard,
}

impl Desktop {
    /// Creates and starts a hardened desktop; `env` are extra `-e` values.
    fn run(test: &str, image: &str, env: &[&str]) -> Self {
        let name = unique_name(&format!("dm-sup-{test}"));
        let guard = ContainerGuard::new(&name);
        let workspace = TempDir::new(&format!("dm-sup-ws-{test}"));
        let mount = format!("{}:/home/desk/workspace", workspace.path().display());
        let run_dir = TempDir::new(&format!("dm-sup-run-{test}"));
        let run_mount = format!("{}:/run/dormouse", run_dir.path().display());
        let label = format!("{TEST_LABEL}=1");
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            &name,
            "--label",
            &label,
            "--network",
            "none",
            "--ipc",
            "private",
            "--cgroupns",
            "private",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "--pids-limit",
            "1024",
            "--memory",
            "2g",
            "--shm-size",
            "256m",
            "-v",
            &mount,
            "-v",
            &run_mount,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        for cap in REQUIRED_CAPABILITIES {
            args.extend(["--cap-add".into(), (*cap).to_owned()]);
        }
        for e in env {
            args.extend(["-e".into(), (*e).to_owned()]);
        }
        if let Ok(bin) = std::env::var("DORMOUSE_TEST_SUPERVISOR_BIN") {
            args.extend([
                "-v".into(),
                format!("{bin}:/usr/local/bin/dormouse-supervisor:ro"),
                "--entrypoint".into(),
                "/usr/local/bin/dormouse-supervisor".into(),
                image.to_owned(),
                "run".into(),
            ]);
        } else {
            args.push(image.to_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker_ok(&args);
        Self {
            name,
            workspace,
            run_dir,
            _guard: guard,
        }
    }

    fn ws(&self, rel: &str) -> PathBuf {
        self.workspace.path().join(rel)
    }

    /// `docker exec` as uid 1000 with the desktop's environment.
    fn exec_desk(&self, cmd: &[&str]) -> std::process::Output {
        let mut args = vec![
            "exec",
            "-u",
            "1000:1000",
            "-e",
            "HOME=/home/desk",
            "-e",
            "DISPLAY=:1",
            &self.name,
        ];
        args.extend_from_slice(cmd);
        docker(&args)
    }

    /// `docker exec` as root.
    fn exec_root(&self, cmd: &[&str]) -> std::process::Output {
        let mut args = vec!["exec", &self.name];
        args.extend_from_slice(cmd);
        docker(&args)
    }

    /// Waits until X answers a client running as uid 1000.
    fn wait_for_x(&self) {
        let started = Instant::now();
        loop {
            if self.exec_desk(&["xdpyinfo"]).status.success() {
                return;
            }
            assert!(
                started.elapsed() < WAIT,
                "X did not answer within {WAIT:?}; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `cond` holds, checking every 100 ms.
    fn wait_until(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let started = Instant::now();
        while !cond() {
            assert!(
                started.elapsed() < WAIT,
                "{what}: not within {WAIT:?}; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn logs(&self) -> String {
        let out = docker(&["logs", &self.name]);
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        text
    }

    /// `docker stop`; returns how long it took and the exit code.
    fn stop(&self) -> (Duration, i64) {
        let started = Instant::now();
        docker_ok(&["stop", &self.name]);
        let took = started.elapsed();
        (took, self.exit_code())
    }

    fn exit_code(&self) -> i64 {
        docker_ok(&["inspect", "-f", "{{.State.ExitCode}}", &self.name])
            .parse()
            .unwrap()
    }

    /// `docker start`, and the time until the supervisor logged the X server
    /// ready (its log timestamps share the host's clock).
    fn start_and_time_x_ready(&self) -> Duration {
        let before_logs = self.logs().lines().count();
        let t0 = chrono::Utc::now();
        docker_ok(&["start", &self.name]);
        // Its own line, not X answering: the supervisor logs it after its
        // probe of the X server, which xdpyinfo may beat.
        let mut line = None;
        self.wait_until("the supervisor logs the X server ready", || {
            line = self
                .logs()
                .lines()
                .skip(before_logs)
                .find(|l| l.contains("service ready") && l.contains("\"xvfb\""))
                .map(str::to_owned);
            line.is_some()
        });
        let line = line.unwrap_or_default();
        let stamp = line.split_whitespace().next().unwrap();
        let ready: chrono::DateTime<chrono::Utc> = stamp.parse().unwrap();
        (ready - t0).to_std().unwrap_or_default()
    }

    /// VmRSS of PID 1 (the supervisor), in KiB.
    fn supervisor_rss_kib(&self) -> u64 {
        let out = self.exec_root(&["cat", "/proc/1/status"]);
        let status = String::from_utf8_lossy(&out.stdout);
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no VmRSS in {status}"))
    }

    fn start_cookie_server(&self, port: u16) {
        let script = self.ws("cookie-server.pl");
        std::fs::write(&script, COOKIE_SERVER).unwrap();
        let port = port.to_string();
        docker_ok(&[
            "exec",
            "-d",
            "-u",
            "1000:1000",
            &self.name,
            "perl",
            "/home/desk/workspace/cookie-server.pl",
            &port,
            "/home/desk/workspace/requests.log",
        ]);
        // Ready when it accepts (bash's /dev/tcp: no curl in the guest).
        let probe = format!("exec 3<>/dev/tcp/127.0.0.1/{port}");
        self.wait_until("cookie server listening", || {
            self.exec_desk(&["bash", "-c", &probe]).status.success()
        });
    }

    /// Headless Chromium on the desktop user's profile: the page's DOM, and
    /// what Chromium said on stderr.
    fn chromium_dump(&self, url: &str) -> (bool, String, String) {
        let out = self.exec_desk(&[
            "timeout",
            "60",
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--user-data-dir=/home/desk/.config/chromium",
            "--dump-dom",
            url,
        ]);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// One request on the guest socket (through its host-side bind mount).
fn ask(desk: &Desktop, request: &Request) -> Response {
    let path = desk
        .run_dir
        .path()
        .join(dormouse_protocol::SOCKET_FILE_NAME);
    desk.wait_until("the guest socket", || path.exists());
    let mut stream = UnixStream::connect(&path).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    frame::write_frame(&mut stream, request, &[]).unwrap();
    frame::read_frame::<Response>(&mut stream).unwrap().message
}

fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

#[test]
fn killed_desktop_comes_back_with_x_profile_and_cookie() {
    let test = "killed_desktop_comes_back_with_x_profile_and_cookie";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    let desk = Desktop::run("kill", &image, &[]);
    desk.wait_for_x();
    let rss = desk.supervisor_rss_kib();

    // Chromium writes a persistent cookie into the workspace profile.
    desk.start_cookie_server(8123);
    let (ok, dom, err) = desk.chromium_dump("http://127.0.0.1:8123/set/k1ll3d");
    assert!(ok && dom.contains("set"), "set cookie: {dom}\n{err}");
    assert!(exists(
        &desk.ws(".browser-profiles/chromium/Default/Cookies")
    ));

    // A browser holds the profile when the container is killed.
    docker_ok(&[
        "exec",
        "-d",
        "-u",
        "1000:1000",
        "-e",
        "HOME=/home/desk",
        "-e",
        "DISPLAY=:1",
        &desk.name,
        "chromium",
        "--no-sandbox",
        "--no-first-run",
        "--disable-gpu",
        "about:blank",
    ]);
    let lock = desk.ws(".browser-profiles/chromium/SingletonLock");
    desk.wait_until("chromium holds its profile", || is_link(&lock));

    // A zombie: the shell exits at once, its child is reparented to PID 1
    // and must be reaped there when it ends.
    let out = desk.exec_root(&["sh", "-c", "sleep 1 & echo $!"]);
    let orphan = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!orphan.is_empty());
    let stat = format!("/proc/{orphan}/stat");
    desk.wait_until("the orphan is reaped", || {
        !desk.exec_root(&["test", "-e", &stat]).status.success()
    });

    docker_ok(&["kill", "-s", "KILL", &desk.name]);
    assert!(is_link(&lock), "the kill left the lock behind");

    let x_ready = desk.start_and_time_x_ready();
    assert!(!is_link(&lock), "stale SingletonLock cleared at start");
    desk.start_cookie_server(8124);
    // The cookie was set for 127.0.0.1 (any port).
    let (ok, dom, err) = desk.chromium_dump("http://127.0.0.1:8124/echo");
    assert!(ok, "chromium failed after the kill: {err}");
    assert!(!err.contains("profile appears to be in use"), "{err}");
    assert!(
        dom.contains("cookie=[dormouse=k1ll3d]"),
        "cookie lost: {dom}"
    );
    let rss_after = desk.supervisor_rss_kib();

    let (took, code) = desk.stop();
    println!(
        "NUMBERS supervisor_rss_kib={rss} (after restart {rss_after}) docker_start_to_x_ready_ms={} docker_stop_ms={} exit_code={code}",
        x_ready.as_millis(),
        took.as_millis()
    );
    assert_eq!(code, 0, "logs:\n{}", desk.logs());
    assert!(took < Duration::from_secs(10), "docker stop took {took:?}");
}

#[test]
fn stale_locks_planted_while_stopped_are_removed() {
    let test = "stale_locks_planted_while_stopped_are_removed";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    let desk = Desktop::run("locks", &image, &[]);
    desk.wait_for_x();
    let (_, code) = desk.stop();
    assert_eq!(code, 0);

    // Build the planted files on the host, then `docker cp` them in.
    let plant = TempDir::new("dm-sup-plant");
    let p = plant.path();
    let chromium = p.join("chromium");
    let firefox = p.join("mozilla/firefox/abc.default-esr");
    std::fs::create_dir_all(chromium.join("Default")).unwrap();
    std::fs::create_dir_all(&firefox).unwrap();
    std::os::unix::fs::symlink("otherhost-4242", chromium.join("SingletonLock")).unwrap();
    std::os::unix::fs::symlink(
        "/tmp/gone/SingletonSocket",
        chromium.join("SingletonSocket"),
    )
    .unwrap();
    std::os::unix::fs::symlink("1234", chromium.join("SingletonCookie")).unwrap();
    std::fs::write(chromium.join("lock"), "a file named lock is no lock").unwrap();
    std::fs::write(
        chromium.join("Default/Preferences"),
        r#"{"profile":{"exit_type":"Crashed","exited_cleanly":false,"name":"Person 1"}}"#,
    )
    .unwrap();
    std::fs::write(firefox.join(".parentlock"), "").unwrap();
    std::os::unix::fs::symlink("127.0.0.1:+4242", firefox.join("lock")).unwrap();
    std::fs::write(firefox.join("prefs.js"), "// kept").unwrap();
    std::fs::write(p.join("X1-lock"), "      4242\n").unwrap();
    std::fs::write(p.join("X1"), "").unwrap();
    std::os::unix::fs::symlink("elsewhere", p.join("SingletonLock")).unwrap();

    let cp = |from: &Path, to: &str| {
        docker_ok(&[
            "cp",
            &from.display().to_string(),
            &format!("{}:{to}", desk.name),
        ]);
    };
    let profiles = "/home/desk/workspace/.browser-profiles";
    cp(&chromium.join("."), &format!("{profiles}/chromium/"));
    docker_ok(&[
        "cp",
        &p.join("mozilla").display().to_string(),
        &format!("{}:{profiles}/", desk.name),
    ]);
    cp(&p.join("X1-lock"), "/tmp/.X1-lock");
    cp(&p.join("X1"), "/tmp/.X11-unix/X1");
    cp(&p.join("SingletonLock"), "/home/desk/SingletonLock");
    assert!(is_link(
        &desk.ws(".browser-profiles/chromium/SingletonLock")
    ));

    docker_ok(&["start", &desk.name]);
    desk.wait_for_x();

    let ws = |rel: &str| desk.ws(&format!(".browser-profiles/{rel}"));
    for gone in [
        "chromium/SingletonLock",
        "chromium/SingletonSocket",
        "chromium/SingletonCookie",
        "mozilla/firefox/abc.default-esr/.parentlock",
        "mozilla/firefox/abc.default-esr/lock",
    ] {
        assert!(!exists(&ws(gone)), "{gone} should be gone");
    }
    assert!(
        exists(&ws("chromium/lock")),
        "a plain file named lock stays"
    );
    assert!(exists(&ws("mozilla/firefox/abc.default-esr/prefs.js")));
    assert!(
        desk.exec_root(&["test", "-L", "/home/desk/SingletonLock"])
            .status
            .success(),
        "nothing outside the profiles root is touched"
    );
    // The X lock is gone (the running server may hold a fresh one of its
    // own; the planted pid 4242 must not be in it).
    let lock = desk.exec_root(&["cat", "/tmp/.X1-lock"]);
    assert!(!String::from_utf8_lossy(&lock.stdout).contains("4242"));
    let prefs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ws("chromium/Default/Preferences")).unwrap())
            .unwrap();
    assert_eq!(prefs["profile"]["exit_type"], "Normal", "no restore bubble");
    assert_eq!(prefs["profile"]["name"], "Person 1");
    let logs = desk.logs();
    assert!(logs.contains("removed stale lock"), "{logs}");
    let (_, code) = desk.stop();
    assert_eq!(code, 0);
}

#[test]
fn graceful_stop_closes_the_autostarted_browser_first() {
    let test = "graceful_stop_closes_the_autostarted_browser_first";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    let desk = Desktop::run("browser", &image, &["DORMOUSE_BROWSER=chromium"]);
    desk.wait_for_x();
    let lock = desk.ws(".browser-profiles/chromium/SingletonLock");
    desk.wait_until("the autostarted browser holds its profile", || {
        is_link(&lock)
    });

    // The running browser gets a cookie just before the stop: only a clean
    // shutdown writes it to disk in time.
    desk.start_cookie_server(8125);
    let open = desk.exec_desk(&[
        "chromium",
        "--no-sandbox",
        "http://127.0.0.1:8125/set/fl0shed",
    ]);
    assert!(open.status.success(), "{open:?}");
    let requests = desk.ws("requests.log");
    desk.wait_until("the page that set the cookie loaded", || {
        std::fs::read_to_string(&requests).is_ok_and(|r| r.contains("/loaded"))
    });
    let (took, code) = desk.stop();
    let logs = desk.logs();
    let ms = took.as_millis();
    println!("NUMBERS docker_stop_with_browser_ms={ms} exit_code={code}");
    assert_eq!(code, 0, "{logs}");
    assert!(took < Duration::from_secs(10), "docker stop took {took:?}");
    let browser_line = logs
        .lines()
        .find(|l| l.contains("service stopped") && l.contains("\"browser\""))
        .unwrap_or_else(|| panic!("browser not stopped by the supervisor:\n{logs}"));
    assert!(browser_line.contains("clean=true"), "{browser_line}");
    let order: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("service stopped"))
        .filter_map(|l| l.split("service=\"").nth(1)?.split('"').next())
        .collect();
    // The reverse of the start order (the taskbar starts after openbox and VNC).
    let reverse_of_start = ["browser", "taskbar", "vnc", "openbox", "xvfb"];
    assert_eq!(order, reverse_of_start, "{logs}");
    assert!(logs.contains("all_reaped=true"), "{logs}");

    // The profile was closed, not abandoned: no lock left, a clean exit
    // recorded, and the fresh cookie on disk.
    assert!(
        !is_link(&lock),
        "a clean shutdown releases the profile lock"
    );
    let prefs =
        std::fs::read_to_string(desk.ws(".browser-profiles/chromium/Default/Preferences")).unwrap();
    assert!(prefs.contains(r#""exit_type":"Normal""#), "{prefs}");
    let cookies = std::fs::read(desk.ws(".browser-profiles/chromium/Default/Cookies")).unwrap();
    assert!(
        cookies.windows(b"dormouse".len()).any(|w| w == b"dormouse"),
        "the cookie set just before the stop was not flushed"
    );
}

#[test]
fn a_killed_x_server_is_restarted() {
    let test = "a_killed_x_server_is_restarted";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    let desk = Desktop::run("xkill", &image, &[]);
    let all_ready = |n: usize| desk.logs().matches("service ready").count() >= n;
    desk.wait_until("every service ready", || all_ready(3));
    let out = desk.exec_root(&["pkill", "-KILL", "-x", "Xvfb"]);
    assert!(out.status.success(), "{out:?}");
    desk.wait_until("the supervisor saw the X server fail", || {
        desk.logs().contains("service failed")
    });
    desk.wait_for_x();
    // Everything after X comes back too (it lost its display).
    desk.wait_until("X, window manager and VNC ready again", || all_ready(6));
    let (_, code) = desk.stop();
    assert_eq!(code, 0);
}

/// A window manager killed with SIGKILL leaves `_NET_SUPPORTING_WM_CHECK`
/// on the root window. Its successor counts as ready only once it announces
/// itself: here a stand-in that never does stays `starting`, and the real
/// one, back in its place, is ready again.
#[test]
fn a_restarted_window_manager_is_not_ready_on_its_predecessors_leftover() {
    let test = "a_restarted_window_manager_is_not_ready_on_its_predecessors_leftover";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    let desk = Desktop::run("wmleft", &image, &[]);
    // Readiness and the window manager's service, once the status lists it
    // (a status taken while the services are being set up may not yet).
    let openbox = |desk: &Desktop| {
        let Response::Status(status) = ask(desk, &Request::Status) else {
            panic!("no status");
        };
        status
            .services
            .iter()
            .find(|s| s.name == "openbox")
            .cloned()
            .map(|wm| (status.ready, wm))
    };
    let listed = |desk: &Desktop| openbox(desk).expect("openbox in the status");
    desk.wait_until("the desktop ready", || {
        openbox(&desk).is_some_and(|(r, _)| r)
    });
    let (_, before) = listed(&desk);
    // A stand-in found first on the services' PATH: runs, never announces.
    let out = desk.exec_root(&[
        "sh",
        "-c",
        "printf '#!/bin/sh\\nexec sleep 600\\n' > /usr/local/bin/openbox \
         && chmod 755 /usr/local/bin/openbox && pkill -KILL -x openbox",
    ]);
    assert!(out.status.success(), "{out:?}");
    desk.wait_until("the stand-in started", || {
        openbox(&desk).is_some_and(|(_, wm)| {
            wm.restarts > before.restarts && wm.pid.is_some() && wm.pid != before.pid
        })
    });
    // Ready would follow within milliseconds if the leftover counted.
    std::thread::sleep(Duration::from_millis(1500));
    let (ready, wm) = listed(&desk);
    assert_eq!(wm.state, ServiceRunState::Starting, "{wm:?}");
    assert!(!ready, "not ready without a window manager: {wm:?}");

    let out = desk.exec_root(&[
        "sh",
        "-c",
        "rm /usr/local/bin/openbox && pkill -KILL -f '^sleep 600'",
    ]);
    assert!(out.status.success(), "{out:?}");
    desk.wait_until("the real window manager ready again", || {
        openbox(&desk).is_some_and(|(ready, wm)| ready && wm.state == ServiceRunState::Running)
    });
    let (_, code) = desk.stop();
    assert_eq!(code, 0);
}

/// The numbers of the issue's closing note, over several stop/start cycles:
/// supervisor RSS, `docker start` → X ready, `docker stop` time and code.
/// Printed, not asserted (beyond exit code 0 and the engine's 10 s bound).
#[test]
fn stop_start_cycles_numbers() {
    let test = "stop_start_cycles_numbers";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    let cycles: usize = std::env::var("DORMOUSE_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let desk = Desktop::run("cycles", &image, &[]);
    desk.wait_for_x();
    let (mut ready, mut stops, mut rss) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..cycles {
        // Settled: the self-probe (with its screenshot) has run.
        desk.wait_until("ready after the self-probe", || {
            desk.logs().matches("self-probe").count() > stops.len()
        });
        rss.push(desk.supervisor_rss_kib());
        let (took, code) = desk.stop();
        assert_eq!(code, 0, "{}", desk.logs());
        assert!(took < Duration::from_secs(10));
        stops.push(took);
        ready.push(desk.start_and_time_x_ready());
    }
    let ms = |d: &[Duration]| {
        let mut v: Vec<u128> = d.iter().map(Duration::as_millis).collect();
        v.sort_unstable();
        format!("median {} max {} all {v:?}", v[v.len() / 2], v[v.len() - 1])
    };
    rss.sort_unstable();
    println!(
        "NUMBERS cycles={cycles} supervisor_rss_kib: median {} max {} | docker_start_to_x_ready_ms: {} | docker_stop_ms: {} | exit codes all 0",
        rss[rss.len() / 2],
        rss[rss.len() - 1],
        ms(&ready),
        ms(&stops)
    );
}

#[test]
fn quiesce_closes_the_browser_cleanly_and_keeps_the_desktop() {
    let test = "quiesce_closes_the_browser_cleanly_and_keeps_the_desktop";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    let desk = Desktop::run("quiesce", &image, &["DORMOUSE_BROWSER=chromium"]);
    desk.wait_for_x();
    let lock = desk.ws(".browser-profiles/chromium/SingletonLock");
    desk.wait_until("the autostarted browser holds its profile", || {
        is_link(&lock)
    });
    desk.wait_until("the browser window is up", || {
        desk.exec_desk(&["xdotool", "search", "--onlyvisible", "--class", "chromium"])
            .status
            .success()
    });

    // The run directory (a host bind mount) is root's alone.
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let meta = std::fs::metadata(desk.run_dir.path()).unwrap();
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (0, 0o700));

    let started = Instant::now();
    let Response::Quiesced(quiesced) = ask(&desk, &Request::Quiesce { timeout_ms: 8000 }) else {
        panic!("no quiesced answer");
    };
    println!(
        "NUMBERS quiesce_ms={} {quiesced:?}",
        started.elapsed().as_millis()
    );
    assert!(quiesced.complete, "{quiesced:?}");
    assert!(
        quiesced.closed.iter().any(|c| c == "browser"),
        "{quiesced:?}"
    );
    assert!(!is_link(&lock), "the browser released its profile");
    let prefs =
        std::fs::read_to_string(desk.ws(".browser-profiles/chromium/Default/Preferences")).unwrap();
    assert!(prefs.contains(r#""exit_type":"Normal""#), "{prefs}");

    // The desktop itself stays up; the browser stays closed until a stop.
    desk.wait_for_x();
    let Response::Status(status) = ask(&desk, &Request::Status) else {
        panic!("no status answer");
    };
    let browser = status
        .services
        .iter()
        .find(|s| s.name == "browser")
        .unwrap();
    assert_eq!(browser.state, ServiceRunState::Stopped, "{status:?}");
    let (_, code) = desk.stop();
    assert_eq!(code, 0);
}

#[test]
fn a_crash_loop_degrades_the_desktop_with_its_reason() {
    let test = "a_crash_loop_degrades_the_desktop_with_its_reason";
    if !docker_available(test) {
        return;
    }
    let Some(image) = desktop_image(test) else {
        return;
    };
    // The image has no Google Chrome: the autostart fails every time.
    let desk = Desktop::run(
        "crashloop",
        &image,
        &[
            "DORMOUSE_BROWSER=google-chrome",
            "DORMOUSE_CRASH_LOOP_FAILURES=3",
        ],
    );
    desk.wait_for_x();
    let mut last = None;
    desk.wait_until("the desktop turns degraded", || {
        let Response::Status(status) = ask(&desk, &Request::Status) else {
            return false;
        };
        let degraded = status.phase == dormouse_protocol::Phase::Degraded;
        last = Some(status);
        degraded
    });
    let status = last.unwrap();
    let problem = status.problem.clone().unwrap_or_default();
    assert!(problem.contains("browser: crash loop"), "{status:?}");
    assert!(
        problem.contains("cannot start"),
        "the cause is named: {status:?}"
    );
    let browser = status
        .services
        .iter()
        .find(|s| s.name == "browser")
        .unwrap();
    assert_eq!(browser.state, ServiceRunState::Failed, "{status:?}");
    assert!(!status.ready);
    let (_, code) = desk.stop();
    assert_eq!(code, 0);
}
