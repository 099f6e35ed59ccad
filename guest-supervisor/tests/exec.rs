//! Exec on the host, through the production code: uid 1000, exit codes and
//! signals, timeouts and cancellation that leave no process behind (checked
//! in `/proc` independently of the exec module), output caps, raw bytes,
//! stdin, working directories, refusals, the busy count, and the round trip
//! of `true`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod exec_support;

use std::future::pending;
use std::time::Duration;

use dormouse_protocol::exec::ExecRequest;
use dormouse_supervisor::exec::{self, Ended, ExecError};
use exec_support::{init, runner, status_of, token, wait_for, with_arg, Workspace, UID};

fn shell(command: &str) -> ExecRequest {
    ExecRequest::shell(command)
}

#[tokio::test]
async fn runs_as_the_desktop_user_in_the_workspace_with_the_desktop_environment() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let mut req = shell("id -u; id -g; id -G; pwd; echo \"$HOME|$USER|$DISPLAY|$LANG|$FOO\"; echo \"$DORMOUSE_EXEC\"");
    req.env.insert("FOO".into(), "bar baz".into());
    let done = runner.run(req, pending()).await.expect("runs");
    assert_eq!(done.ended, Ended::Exited);
    assert_eq!(done.result.exit_code, Some(0));
    let out = String::from_utf8(done.result.stdout).expect("utf-8");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1000");
    assert_eq!(lines[1], "1000");
    // Supplementary groups: only the exec's tag, no group of root's.
    let groups: Vec<u32> = lines[2]
        .split_whitespace()
        .map(|g| g.parse().unwrap())
        .collect();
    assert!(groups.contains(&1000));
    assert!(!groups.contains(&0), "no root group: {groups:?}");
    assert_eq!(
        groups.len(),
        2,
        "the gid and the tag, nothing else: {groups:?}"
    );
    assert_eq!(lines[3], ws.path().to_str().unwrap());
    assert_eq!(lines[4], "/home/desk|desk|:1|C.UTF-8|bar baz");
    assert!(lines[5].parse::<u64>().is_ok(), "marker: {:?}", lines[5]);
    assert!(done.result.stderr.is_empty());

    // argv runs without a shell; the PATH of the environment finds `id`.
    let done = runner
        .run(ExecRequest::argv(["id", "-u"]), pending())
        .await
        .expect("runs");
    assert_eq!(done.result.stdout, b"1000\n");
}

#[tokio::test]
async fn exit_codes_and_signals() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let done = runner.run(shell("exit 3"), pending()).await.expect("runs");
    assert_eq!(
        (done.result.exit_code, done.result.signal.as_deref()),
        (Some(3), None)
    );
    assert!(!done.result.timed_out);
    let done = runner
        .run(ExecRequest::argv(["true"]), pending())
        .await
        .expect("runs");
    assert_eq!(done.result.exit_code, Some(0));
    assert_eq!(done.kill.killed, 0, "nothing left behind, nothing killed");

    let done = runner
        .run(shell("kill -TERM $$"), pending())
        .await
        .expect("runs");
    assert_eq!(done.result.exit_code, None);
    assert_eq!(done.result.signal.as_deref(), Some("SIGTERM"));
    let done = runner
        .run(shell("kill -SEGV $$"), pending())
        .await
        .expect("runs");
    assert_eq!(done.result.signal.as_deref(), Some("SIGSEGV"));
}

#[tokio::test]
async fn a_timeout_kills_the_grandchild_too() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let t = token();
    let mut req = shell(&format!("sleep {t} & sleep {t}"));
    req.timeout_ms = 300;
    let done = runner.run(req, pending()).await.expect("runs");
    assert!(done.result.timed_out);
    assert_eq!(done.ended, Ended::TimedOut);
    assert_eq!(done.result.exit_code, None);
    assert_eq!(done.result.signal.as_deref(), Some("SIGKILL"));
    assert!(
        done.result.duration_ms >= 300,
        "{}",
        done.result.duration_ms
    );
    assert!(done.kill.killed >= 1, "the background sleep was killed");
    // The answer came after the confirmation: nothing to wait for.
    assert_eq!(with_arg(&t), Vec::<u32>::new(), "processes left");
}

#[tokio::test]
async fn escapes_by_setsid_and_double_fork_are_killed_and_confirmed_gone() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let (a, b, c) = (token(), token(), token());
    // `setsid` makes a new session (and leaves the process group); the
    // subshell's double fork reparents the sleep to the subreaper.
    let mut req = shell(&format!(
        "setsid sleep {a} & (setsid sh -c 'sleep {b} &' &); sleep {c}"
    ));
    req.timeout_ms = 60_000;
    let run = runner.run(req, pending());
    tokio::pin!(run);
    // While it runs: the escapees are there, as uid 1000, in other
    // sessions, and no longer children of the exec.
    let watch = async {
        let a_pid = wait_for(&a, 1).await[0];
        let b_pid = wait_for(&b, 1).await[0];
        let c_pid = wait_for(&c, 1).await[0];
        let (uid_a, sid_a, _) = status_of(a_pid).unwrap();
        let (_, sid_b, _) = status_of(b_pid).unwrap();
        let (_, sid_c, _) = status_of(c_pid).unwrap();
        assert_eq!(uid_a, UID);
        assert_ne!(sid_a, sid_c, "setsid left the exec's session");
        assert_ne!(sid_b, sid_c);
        // Kill the main sleep: the exec ends and must take the escapees
        // with it.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(c_pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    };
    let done = tokio::select! {
        done = &mut run => done,
        () = watch => run.await,
    }
    .expect("runs");
    assert_eq!(done.ended, Ended::Exited);
    assert!(
        done.kill.killed >= 2,
        "both escapees killed: {:?}",
        done.kill
    );
    for t in [&a, &b, &c] {
        assert_eq!(with_arg(t), Vec::<u32>::new(), "{t} left");
    }
}

#[tokio::test]
async fn cancelling_mid_command_kills_everything_before_answering() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let (a, b) = (token(), token());
    let req = shell(&format!("setsid sleep {a} & sleep {b} & wait"));
    let seen = async {
        wait_for(&a, 1).await;
        wait_for(&b, 1).await;
    };
    let done = runner.run(req, seen).await.expect("runs");
    assert_eq!(done.ended, Ended::Cancelled);
    assert_eq!(done.result.signal.as_deref(), Some("SIGKILL"));
    assert!(!done.result.timed_out);
    assert_eq!(with_arg(&a), Vec::<u32>::new());
    assert_eq!(with_arg(&b), Vec::<u32>::new());
}

#[tokio::test]
async fn a_dropped_caller_still_gets_everything_killed() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let (a, b) = (token(), token());
    let req = shell(&format!("setsid sleep {a} & sleep {b}"));
    let run = runner.run(req, pending());
    let started = async {
        wait_for(&a, 1).await;
        wait_for(&b, 1).await;
    };
    tokio::select! {
        _ = run => panic!("ended on its own"),
        () = started => {}
    }
    // The caller's future is gone (a client that disconnected); the keeper
    // kills in the background.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !(with_arg(&a).is_empty() && with_arg(&b).is_empty()) {
        assert!(tokio::time::Instant::now() < deadline, "not killed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn output_over_the_cap_is_truncated_and_never_blocks_the_child() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    // 64 MiB on stdout and 8 MiB on stderr, far beyond any pipe buffer.
    let mut req = shell("head -c 67108864 /dev/zero; head -c 8388608 /dev/zero >&2; echo done >&2");
    req.max_output_bytes = 1000;
    req.timeout_ms = 30_000;
    let done = runner.run(req, pending()).await.expect("runs");
    assert_eq!(done.ended, Ended::Exited, "finished, not timed out");
    assert_eq!(done.result.exit_code, Some(0));
    assert_eq!(done.result.stdout, vec![0u8; 1000]);
    assert_eq!(done.result.stderr, vec![0u8; 1000]);
    assert!(done.result.stdout_truncated && done.result.stderr_truncated);

    // Exactly at the cap is not truncated.
    let mut req = shell("printf 12345");
    req.max_output_bytes = 5;
    let done = runner.run(req, pending()).await.expect("runs");
    assert_eq!(done.result.stdout, b"12345");
    assert!(!done.result.stdout_truncated);
}

#[tokio::test]
async fn bytes_are_bytes_and_stdin_is_fed_then_closed() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let done = runner
        .run(
            shell("printf '\\377\\376ok\\000'; printf '\\200' >&2"),
            pending(),
        )
        .await
        .expect("runs");
    assert_eq!(done.result.stdout, b"\xff\xfeok\0");
    assert_eq!(done.result.stderr, b"\x80");

    let input: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    let mut req = ExecRequest::argv(["cat"]);
    req.stdin = Some(input.clone());
    req.max_output_bytes = 1024 * 1024;
    let done = runner.run(req, pending()).await.expect("runs");
    assert_eq!(done.result.exit_code, Some(0));
    assert_eq!(done.result.stdout.len(), input.len());
    assert!(done.result.stdout == input, "stdin round trip");

    // No stdin: /dev/null, so `cat` ends at once.
    let mut req = ExecRequest::argv(["cat"]);
    req.timeout_ms = 5_000;
    let done = runner.run(req, pending()).await.expect("runs");
    assert_eq!(done.ended, Ended::Exited);
    assert!(done.result.stdout.is_empty());

    // A child that never reads its stdin does not hang the exec.
    let mut req = shell("exit 7");
    req.stdin = Some(vec![b'x'; 4 * 1024 * 1024]);
    let done = runner.run(req, pending()).await.expect("runs");
    assert_eq!(done.result.exit_code, Some(7));
}

#[tokio::test]
async fn working_directories_are_resolved_as_the_desktop_user() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let sub = ws.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    nix::unistd::chown(
        &sub,
        Some(nix::unistd::Uid::from_raw(UID)),
        Some(nix::unistd::Gid::from_raw(UID)),
    )
    .unwrap();
    let mut req = shell("pwd");
    req.cwd = Some("sub".into());
    let done = runner.run(req, pending()).await.expect("runs");
    assert_eq!(
        String::from_utf8(done.result.stdout).unwrap().trim(),
        sub.to_str().unwrap()
    );
    let mut req = shell("pwd");
    req.cwd = Some("/".into());
    let done = runner.run(req, pending()).await.expect("runs");
    assert_eq!(done.result.stdout, b"/\n");

    // Root may enter this directory; the desktop user may not.
    let private = ws.path().join("root-only");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let mut req = shell("pwd");
    req.cwd = Some(private.to_str().unwrap().into());
    match runner.run(req, pending()).await {
        Err(ExecError::Cwd { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::PermissionDenied);
        }
        other => panic!("expected a cwd refusal, got {other:?}"),
    }
    let mut req = shell("pwd");
    req.cwd = Some("missing".into());
    let err = runner.run(req, pending()).await.unwrap_err();
    assert_eq!(err.code(), "bad_cwd");
}

#[tokio::test]
async fn refusals() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let err = runner
        .run(ExecRequest::argv(["no-such-program-here"]), pending())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_found", "{err}");
    let err = runner
        .run(ExecRequest::argv(["/etc/passwd"]), pending())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "not_executable", "{err}");
    let err = runner
        .run(ExecRequest::argv(Vec::<String>::new()), pending())
        .await
        .unwrap_err();
    assert!(matches!(err, ExecError::Invalid(_)), "{err}");
    // sh -c with a missing program is the shell's business: 127.
    let done = runner
        .run(shell("no-such-program-here"), pending())
        .await
        .expect("runs");
    assert_eq!(done.result.exit_code, Some(127));
}

#[tokio::test]
async fn a_running_exec_counts_as_busy() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let t = token();
    let run = runner.run(shell(&format!("sleep {t}")), async {
        wait_for(&t, 1).await;
        assert!(exec::running_execs() >= 1);
    });
    let done = run.await.expect("runs");
    assert_eq!(done.ended, Ended::Cancelled);
}

#[test]
fn kills_go_through_pidfds() {
    // Kernel 5.3 and later, and a seccomp profile that allows them (Docker's
    // default does): no kill can hit a reused pid.
    assert!(exec::kill::pidfds_available());
}

#[tokio::test]
async fn round_trip_of_true() {
    if !init() {
        return;
    }
    let ws = Workspace::new();
    let runner = runner(&ws);
    let mut times = Vec::new();
    for _ in 0..50 {
        let started = std::time::Instant::now();
        let done = runner
            .run(ExecRequest::argv(["true"]), pending())
            .await
            .expect("runs");
        times.push(started.elapsed());
        assert_eq!(done.result.exit_code, Some(0));
    }
    times.sort();
    let median = times[times.len() / 2];
    eprintln!(
        "exec round trip of `true`: median {:.2} ms, min {:.2} ms, max {:.2} ms (50 runs)",
        median.as_secs_f64() * 1000.0,
        times[0].as_secs_f64() * 1000.0,
        times[times.len() - 1].as_secs_f64() * 1000.0
    );
    assert!(median < Duration::from_secs(1));
}
