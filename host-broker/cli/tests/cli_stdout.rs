//! A closed stdout is the end of output: `dormouse` run as `scripts/up` runs
//! its last step, and with its stdout into pipes whose reader leaves early
//! (`| head -n1`, `| true`), 50 times each, ends 0 every time and never
//! prints "Broken pipe". The broker is a stand-in on loopback answering the
//! two calls those lines make (a screen mint, the egress policy).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};

use dormouse_protocol::egress_policy::{EgressMode, EgressPolicy};
use dormouse_protocol::screen::{ScreenGrant, ScreenMode};

const RUNS: usize = 50;
const TOKEN: &str = "cli-stdout-test-token-0123456789abcdef";

/// Answers every request on `listener`: a screen grant for `POST
/// …/screens`, an `off` policy for `GET …/egress`, else 404.
fn serve(listener: TcpListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        std::thread::spawn(move || answer(stream));
    }
}

fn answer(mut stream: TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("request line");
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).expect("header");
        if header == "\r\n" || header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().expect("length");
            }
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).expect("body");
    let (status, json) = if line.starts_with("POST ") && line.contains("/screens ") {
        let grant = ScreenGrant {
            screen_id: uuid::Uuid::new_v4(),
            mode: ScreenMode::View,
            token: "ab".repeat(32),
            expires_at: chrono::Utc::now() + chrono::Duration::hours(1),
            websocket: "/v1/screens/x/rfb".into(),
        };
        ("201 Created", serde_json::to_string(&grant).expect("json"))
    } else if line.starts_with("GET ") && line.contains("/egress ") {
        let policy = EgressPolicy::of_mode(EgressMode::Off);
        ("200 OK", serde_json::to_string(&policy).expect("json"))
    } else {
        (
            "404 Not Found",
            r#"{"error":{"code":"not_found","message":"no such route"}}"#.to_owned(),
        )
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{json}",
        json.len()
    );
}

/// The lines between `# >>> last step` and `# <<< last step` of
/// scripts/up, and its `json_field` helper.
fn last_step() -> (String, String) {
    let up = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/up");
    let script = std::fs::read_to_string(up).expect("scripts/up");
    let start = script.find("# >>> last step").expect("start marker");
    let end = script.find("# <<< last step").expect("end marker");
    let helper = script
        .lines()
        .find(|l| l.starts_with("json_field() "))
        .expect("json_field in scripts/up")
        .to_owned();
    (script[start..end].to_owned(), helper)
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `body` under `bash` as scripts/up does (`set -euo pipefail`), with
/// `dormouse` the CLI binary pointed at `url`.
fn bash(url: &str, token_file: &Path, prelude: &str, body: &str) -> Run {
    let script = format!(
        "set -euo pipefail\n\
         say() {{ printf '==> %s\\n' \"$*\" >&2; }}\n\
         dormouse() {{ {bin:?} --url {url:?} --token-file {token:?} \"$@\"; }}\n\
         {prelude}\n\
         id=0123abcd-0000-4000-8000-000000000000\n\
         name=desk\n\
         cli='target/release/dormouse --data-dir /tmp/x'\n\
         {body}",
        bin = env!("CARGO_BIN_EXE_dormouse"),
        token = token_file,
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .expect("bash");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[test]
fn a_closed_stdout_ends_the_output_with_exit_0() {
    if Command::new("python3").arg("--version").output().is_err() {
        panic!("python3 is needed (scripts/up's json_field uses it)");
    }
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || serve(listener));
    let token = tempfile_path();
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    let (step, json_field) = last_step();

    let forms = [
        ("scripts/up's last step", step.as_str()),
        ("| head -n1", "dormouse screen \"$id\" --ttl 1h | head -n1"),
        ("| true", "dormouse screen \"$id\" --ttl 1h | true"),
        (
            "--json | true",
            "dormouse --json screen \"$id\" --ttl 1h | true",
        ),
    ];
    for (what, body) in forms {
        let mut zero = 0;
        for _ in 0..RUNS {
            let run = bash(&url, &token, &json_field, body);
            assert!(
                !run.stderr.contains("Broken pipe") && !run.stderr.contains("dormouse:"),
                "{what}: {}",
                run.stderr
            );
            if run.code == Some(0) {
                zero += 1;
            } else {
                eprintln!("{what}: exit {:?}: {}", run.code, run.stderr);
            }
            if what == "scripts/up's last step" {
                assert!(
                    run.stdout
                        .starts_with(&format!("{url}/panel/screen.html#screen=")),
                    "{}",
                    run.stdout
                );
                assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
                assert!(
                    run.stderr
                        .contains("target/release/dormouse --data-dir /tmp/x egress desk open"),
                    "{}",
                    run.stderr
                );
            }
        }
        assert_eq!(zero, RUNS, "{what}: {zero} of {RUNS} runs exited 0");
    }
    let _ = std::fs::remove_file(&token);
}

/// A fresh file name in the temporary directory, for the token.
fn tempfile_path() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("dormouse-cli-stdout-{}", uuid::Uuid::new_v4()))
}
