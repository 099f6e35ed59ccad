//! End-to-end: ordinary programs in a desktop with no network interface
//! reach sites on the host's loopback through the broker's egress, by name
//! (`dormoused --egress-hosts`), as uid 1000 with only the proxy
//! environment every exec gets: `curl` over HTTPS to a site whose test CA
//! the desktop trusts (`update-ca-certificates`), `git clone` of a
//! dumb-HTTP repository, `pip download` from a simple index, and a raw TCP
//! echo through CONNECT; and headless Chromium saving screenshots of a host
//! page and of a refusal page to `docs/images/`. Each host server is the
//! independent witness of what reached it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{BrokerOptions, BrokerProcess};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream};
use dormouse_e2e::{desktop_image, docker_available};
use dormouse_protocol::egress_policy::{EgressMode, EgressPolicy};
use dormouse_protocol::exec::ExecRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A static file server on 127.0.0.1 (HTTPS when given a cert and key),
/// logging each request line to `log`; prints its port.
const SERVE_PY: &str = r#"
import http.server, ssl, sys, functools
root, log = sys.argv[1], sys.argv[2]
out = open(log, "a", buffering=1)
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, fmt, *args):
        out.write("%s %s\n" % (self.headers.get("Host", ""), fmt % args))
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(H, directory=root))
if len(sys.argv) > 4:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[3], sys.argv[4])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// A host server process, killed on drop.
struct Server {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Server {
    fn start(dir: &Path, root: &Path, name: &str, tls: Option<(&Path, &Path)>) -> Result<Self> {
        let script = dir.join("serve.py");
        std::fs::write(&script, SERVE_PY)?;
        let log = dir.join(format!("{name}.log"));
        std::fs::write(&log, "")?;
        let mut cmd = Command::new("python3");
        cmd.arg(&script).arg(root).arg(&log);
        if let Some((cert, key)) = tls {
            cmd.arg(cert).arg(key);
        }
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        let port = line
            .trim()
            .parse()
            .with_context(|| format!("{name}: {line:?}"))?;
        Ok(Self { child, port, log })
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A test CA and a server certificate for `tls.test` signed by it.
fn make_certs(dir: &Path) -> Result<()> {
    let d = |f: &str| dir.join(f).display().to_string();
    run(Command::new("openssl").args([
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=Dormouse egress test CA",
        "-keyout",
        &d("ca.key"),
        "-out",
        &d("ca.crt"),
    ]))?;
    run(Command::new("openssl").args([
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=tls.test",
        "-keyout",
        &d("srv.key"),
        "-out",
        &d("srv.csr"),
    ]))?;
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=DNS:tls.test\n")?;
    run(Command::new("openssl").args([
        "x509",
        "-req",
        "-in",
        &d("srv.csr"),
        "-CA",
        &d("ca.crt"),
        "-CAkey",
        &d("ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &d("ext.cnf"),
        "-out",
        &d("srv.crt"),
    ]))?;
    Ok(())
}

/// A bare repository with one commit, ready for dumb HTTP.
fn make_repo(dir: &Path) -> Result<()> {
    let work = dir.join("work");
    std::fs::create_dir_all(&work)?;
    std::fs::write(work.join("README"), "cloned through the egress\n")?;
    let git = |args: &[&str], cwd: &Path| {
        run(Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(cwd))
    };
    git(&["init", "-q"], &work)?;
    git(&["add", "README"], &work)?;
    git(&["commit", "-qm", "one"], &work)?;
    let web = dir.join("web");
    std::fs::create_dir_all(&web)?;
    git(&["clone", "-q", "--bare", "../work", "repo.git"], &web)?;
    git(&["update-server-info"], &web.join("repo.git"))?;
    Ok(())
}

/// A simple index `simple/dmtiny/` linking a hand-made wheel.
fn make_index(dir: &Path) -> Result<()> {
    let web = dir.join("web");
    std::fs::create_dir_all(web.join("simple/dmtiny"))?;
    run(Command::new("python3").arg("-c").arg(
        r#"
import zipfile, sys
name = sys.argv[1] + "/dmtiny-0.1-py3-none-any.whl"
with zipfile.ZipFile(name, "w") as z:
    z.writestr("dmtiny/__init__.py", "X = 1\n")
    z.writestr("dmtiny-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: dmtiny\nVersion: 0.1\n")
    z.writestr("dmtiny-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("dmtiny-0.1.dist-info/RECORD", "")
"#,
    ).arg(&web))?;
    std::fs::write(
        web.join("simple/dmtiny/index.html"),
        "<html><body><a href=\"../../dmtiny-0.1-py3-none-any.whl\">dmtiny-0.1-py3-none-any.whl</a></body></html>\n",
    )?;
    Ok(())
}

/// A TCP echo server on 127.0.0.1.
async fn echo() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

async fn sh(api: &ApiClient, id: Uuid, script: &str) -> Result<(i32, String)> {
    let mut r = ExecRequest::shell(script.to_owned());
    r.timeout_ms = 90_000;
    let out = api.exec(id, &r, false).await?;
    Ok((
        out.exit_code.unwrap_or(-1),
        format!("{}{}", out.stdout, out.stderr),
    ))
}

fn container_of(id: Uuid) -> Result<String> {
    let out = run(Command::new("docker").args([
        "ps",
        "-q",
        "--filter",
        &format!("label=dev.dormouse.computer={id}"),
    ]))?;
    let c = out.lines().next().context("no container for the desktop")?;
    Ok(c.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_in_a_desktop_use_the_egress() -> Result<()> {
    let test = "programs_in_a_desktop_use_the_egress";
    if !docker_available(test) {
        return Ok(());
    }
    let Some(image) = desktop_image(test) else {
        return Ok(());
    };
    let dir = tempfile::tempdir()?;
    make_certs(dir.path())?;
    make_repo(dir.path())?;
    make_index(dir.path())?;
    let web = dir.path().join("web");
    std::fs::write(web.join("index.html"), "served over TLS\n")?;
    std::fs::write(
        web.join("page.html"),
        "<html><body style=\"font: 32px sans-serif\"><h1>A host page</h1>\
         <p>Served on the host's loopback, reached by the name page.test through the desktop's egress policy.</p></body></html>\n",
    )?;
    let tls = Server::start(
        dir.path(),
        &web,
        "tls",
        Some((&dir.path().join("srv.crt"), &dir.path().join("srv.key"))),
    )?;
    let plain = Server::start(dir.path(), &web, "plain", None)?;
    let echo_port = echo().await;
    let hosts = dir.path().join("egress-hosts");
    std::fs::write(
        &hosts,
        "127.0.0.1 tls.test git.test pypi.test echo.test page.test refused.test\n",
    )?;
    let mut options = BrokerOptions::new(&image);
    options.extra_args = vec!["--egress-hosts".into(), hosts.display().to_string()];
    let broker = BrokerProcess::start(options).await?;
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "egress-programs", READY_TIMEOUT)
        .await
        .with_context(|| format!("broker log:\n{}", broker.log_tail(3000)))?;
    let result = async {
        let policy = EgressPolicy {
            mode: EgressMode::Allowlist,
            allow: ["127.0.0.1/32"].iter().map(|r| r.parse().unwrap()).collect(),
            deny: vec!["refused.test".parse().unwrap()],
        };
        api.set_egress(id, &policy).await?;

        // HTTPS: the desktop trusts the test CA, then curl verifies.
        let ctr = container_of(id)?;
        let ca = dir.path().join("ca.crt");
        run(Command::new("docker").args([
            "cp",
            &ca.display().to_string(),
            &format!("{ctr}:/usr/local/share/ca-certificates/dormouse-test.crt"),
        ]))?;
        run(Command::new("docker").args(["exec", "-u", "0", &ctr, "update-ca-certificates"]))?;
        let (rc, out) = sh(&api, id, &format!("id -u; curl -sS --max-time 20 https://tls.test:{}/", tls.port)).await?;
        ensure!(rc == 0 && out.starts_with("1000\n") && out.contains("served over TLS"), "https: {rc} {out}");
        ensure!(tls.requests().contains("tls.test"), "the TLS site saw: {}", tls.requests());

        // git clone of a dumb-HTTP repository.
        let (rc, out) = sh(
            &api,
            id,
            &format!("rm -rf /tmp/repo && git clone -q http://git.test:{}/repo.git /tmp/repo && cat /tmp/repo/README", plain.port),
        )
        .await?;
        ensure!(rc == 0 && out.contains("cloned through the egress"), "git: {rc} {out}");
        ensure!(plain.requests().contains("/repo.git/info/refs"), "the git site saw: {}", plain.requests());

        // pip download from a simple index.
        let (rc, out) = sh(
            &api,
            id,
            &format!(
                "rm -rf /tmp/x && PIP_DISABLE_PIP_VERSION_CHECK=1 pip download --index-url http://pypi.test:{p}/simple/ \
                 --trusted-host pypi.test dmtiny --no-deps -d /tmp/x && ls /tmp/x",
                p = plain.port
            ),
        )
        .await?;
        ensure!(rc == 0 && out.contains("dmtiny-0.1-py3-none-any.whl"), "pip: {rc} {out}");
        ensure!(plain.requests().contains("/dmtiny-0.1-py3-none-any.whl"), "the index saw: {}", plain.requests());

        // Raw TCP through CONNECT: an echo.
        let script = format!(
            "import socket\n\
             s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n\
             s.sendall(b'CONNECT echo.test:{echo_port} HTTP/1.1\\r\\nHost: echo.test:{echo_port}\\r\\n\\r\\n')\n\
             head = b''\n\
             while b'\\r\\n\\r\\n' not in head:\n\
             \x20   b = s.recv(1)\n\
             \x20   if not b: break\n\
             \x20   head += b\n\
             print(head.split(b'\\r\\n')[0].decode())\n\
             s.sendall(b'ping through the egress\\n')\n\
             got = b''\n\
             while len(got) < 24:\n\
             \x20   b = s.recv(100)\n\
             \x20   if not b: break\n\
             \x20   got += b\n\
             print('echo:', got.decode().strip())\n"
        );
        let (rc, out) = sh(&api, id, &format!("python3 - <<'EOF'\n{script}EOF")).await?;
        ensure!(
            rc == 0 && out.contains(" 200") && out.contains("echo: ping through the egress"),
            "echo: {rc} {out}"
        );

        // Chromium, as uid 1000: a host page by name, and a refusal page.
        for (name, file) in [("page.test", "egress-page"), ("refused.test", "egress-refused")] {
            let (rc, out) = sh(
                &api,
                id,
                &format!(
                    "rm -f /home/desk/workspace/{file}.png; timeout 60 chromium --headless=new --no-sandbox \
                     --disable-gpu --user-data-dir=/tmp/shot-{file} --window-size=1280,800 \
                     --screenshot=/home/desk/workspace/{file}.png http://{name}:{}/page.html; \
                     ls -l /home/desk/workspace/{file}.png",
                    plain.port
                ),
            )
            .await?;
            ensure!(rc == 0, "chromium {name}: {rc} {out}");
            let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/images");
            std::fs::create_dir_all(&docs)?;
            run(Command::new("docker").args([
                "cp",
                &format!("{ctr}:/home/desk/workspace/{file}.png"),
                &docs.join(format!("{file}.png")).display().to_string(),
            ]))?;
        }
        ensure!(
            plain.requests().contains("page.test") && plain.requests().contains("/page.html"),
            "the page site saw: {}",
            plain.requests()
        );
        ensure!(!plain.requests().contains("refused.test"), "a refused name reached the site");
        let log = api.egress_log(id, None).await?;
        ensure!(
            log.entries.iter().any(|e| e.host == "refused.test"
                && e.decision == dormouse_protocol::egress_policy::EgressDecision::Refused),
            "{:#?}",
            log.entries
        );
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("broker log:\n{}", broker.log_tail(6000));
    }
    result
}
