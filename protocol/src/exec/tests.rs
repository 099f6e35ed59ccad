//! Tests of the exec messages: validation, framing and their bounds.

use super::*;
use crate::frame::{decode, encode};
use serde_json::json;

fn parse(value: serde_json::Value) -> Result<ExecRequest, serde_json::Error> {
    serde_json::from_value(value)
}

#[test]
fn defaults_and_the_two_command_forms() {
    let req = parse(json!({"argv": ["id", "-u"]})).expect("parses");
    assert_eq!(req.timeout_ms, DEFAULT_TIMEOUT_MS);
    assert_eq!(req.max_output_bytes, DEFAULT_MAX_OUTPUT_BYTES);
    assert_eq!(req.validate(), Ok(vec!["id".into(), "-u".into()]));
    let req = parse(json!({"command": "echo hi | wc -c", "stdin": "AAEC/w=="})).expect("parses");
    assert_eq!(req.stdin.as_deref(), Some(&[0, 1, 2, 255][..]));
    assert_eq!(
        req.validate().expect("valid"),
        ["/bin/sh", "-c", "echo hi | wc -c"]
    );
    let back = serde_json::to_value(&req).expect("serializes");
    assert_eq!(back["stdin"], "AAEC/w==");
    assert!(back.get("argv").is_none());
}

#[test]
fn hostile_requests_are_refused_with_the_field_named() {
    let bad = |value: serde_json::Value| parse(value).expect("parses").validate();
    assert_eq!(bad(json!({})), Err(ExecRequestError::NoCommand));
    assert_eq!(
        bad(json!({"argv": ["a"], "command": "b"})),
        Err(ExecRequestError::BothCommands)
    );
    assert_eq!(
        bad(json!({"argv": []})),
        Err(ExecRequestError::Empty("argv"))
    );
    assert_eq!(
        bad(json!({"argv": [""]})),
        Err(ExecRequestError::Empty("argv[0]"))
    );
    assert_eq!(
        bad(json!({"argv": ["a\u{0}b"]})),
        Err(ExecRequestError::Nul("argv"))
    );
    assert_eq!(
        bad(json!({"command": "x", "cwd": "/a\u{0}"})),
        Err(ExecRequestError::Nul("cwd"))
    );
    assert_eq!(
        bad(json!({"command": "x", "env": {"A=B": "c"}})),
        Err(ExecRequestError::BadEnvName("A=B".into()))
    );
    assert_eq!(
        bad(json!({"command": "x", "env": {"1A": "c"}})),
        Err(ExecRequestError::BadEnvName("1A".into()))
    );
    assert_eq!(
        bad(json!({"command": "x", "env": {"": "c"}})),
        Err(ExecRequestError::BadEnvName(String::new()))
    );
    assert_eq!(
        bad(json!({"command": "x", "env": {"DORMOUSE_EXEC": "7"}})),
        Err(ExecRequestError::ReservedEnvName(EXEC_MARKER_ENV))
    );
    assert_eq!(
        bad(json!({"command": "x", "env": {"A": "\u{0}"}})),
        Err(ExecRequestError::Nul("env"))
    );
    assert_eq!(
        bad(json!({"command": "x", "timeout_ms": 0})),
        Err(ExecRequestError::Timeout(0))
    );
    assert_eq!(
        bad(json!({"command": "x", "timeout_ms": MAX_TIMEOUT_MS + 1})),
        Err(ExecRequestError::Timeout(MAX_TIMEOUT_MS + 1))
    );
    assert!(bad(json!({"command": "x", "timeout_ms": MAX_TIMEOUT_MS})).is_ok());
    assert_eq!(
        bad(json!({"command": "x", "max_output_bytes": MAX_OUTPUT_BYTES_LIMIT + 1})),
        Err(ExecRequestError::OutputLimit(MAX_OUTPUT_BYTES_LIMIT + 1))
    );
    let many: Vec<String> = (0..=MAX_ARGV_ITEMS).map(|i| i.to_string()).collect();
    assert!(matches!(
        bad(json!({ "argv": many })),
        Err(ExecRequestError::TooLarge { field: "argv", .. })
    ));
    let long = "x".repeat(MAX_COMMAND_BYTES + 1);
    assert!(matches!(
        bad(json!({ "command": long })),
        Err(ExecRequestError::TooLarge {
            field: "command",
            ..
        })
    ));
    let long_cwd = "/".repeat(MAX_CWD_BYTES + 1);
    assert!(matches!(
        bad(json!({ "command": "x", "cwd": long_cwd })),
        Err(ExecRequestError::TooLarge { field: "cwd", .. })
    ));
    // Malformed at the serde level: unknown fields, bad base64, negative
    // or fractional numbers.
    assert!(parse(json!({"agrv": ["x"]})).is_err());
    assert!(parse(json!({"command": "x", "stdin": "***"})).is_err());
    assert!(parse(json!({"command": "x", "timeout_ms": -1})).is_err());
    assert!(parse(json!({"command": "x", "timeout_ms": 1.5})).is_err());
}

#[test]
fn stdin_travels_as_the_payload_on_the_guest_socket() {
    let mut req = ExecRequest::shell("cat");
    req.stdin = Some(vec![0xff; 300_000]);
    let (head, payload) = req.clone().into_frame();
    assert_eq!(head.stdin, None);
    assert_eq!(payload.len(), 300_000);
    assert_eq!(head.clone().from_frame(payload.clone()), Ok(req.clone()));
    assert_eq!(head.clone().from_frame(Vec::new()), Ok(head.clone()));
    assert_eq!(req.from_frame(vec![1]), Err(ExecRequestError::StdinTwice));
    assert!(matches!(
        head.from_frame(vec![0; MAX_STDIN_BYTES + 1]),
        Err(ExecRequestError::TooLarge { field: "stdin", .. })
    ));
}

fn result() -> ExecResult {
    ExecResult {
        exit_code: None,
        signal: Some("SIGTERM".into()),
        timed_out: false,
        stdout: b"ok \xff\xfe".to_vec(),
        stderr: b"err".to_vec(),
        stdout_truncated: true,
        stderr_truncated: false,
        duration_ms: 12,
    }
}

#[test]
fn results_render_lossy_or_base64_and_split_for_frames() {
    let r = result();
    let body = serde_json::to_value(r.to_body(OutputEncoding::Utf8)).expect("json");
    assert_eq!(
        body,
        json!({
            "exit_code": null, "signal": "SIGTERM", "timed_out": false,
            "stdout": "ok \u{fffd}\u{fffd}", "stderr": "err",
            "stdout_truncated": true, "stderr_truncated": false, "duration_ms": 12
        })
    );
    let raw = r.to_body(OutputEncoding::Base64);
    assert_eq!(raw.stdout, "b2sg//4=");
    let json = serde_json::to_value(&r).expect("json");
    assert_eq!(json["stdout"], "b2sg//4=");
    assert_eq!(serde_json::from_value::<ExecResult>(json).expect("back"), r);

    let (head, payload) = r.clone().into_frame();
    assert_eq!(head.stdout_len, 5);
    assert_eq!(payload, b"ok \xff\xfeerr");
    assert_eq!(head.clone().join(payload), Ok(r));
    assert_eq!(
        head.join(vec![1, 2]),
        Err(ExecPayloadError {
            stdout_len: 5,
            payload_len: 2
        })
    );
}

#[test]
fn terminal_frames_are_bounded_and_tagged() {
    let open: PtyOpen = serde_json::from_value(json!({"rows": 24, "cols": 80})).expect("parses");
    assert_eq!(open.validate(), Ok(None));
    let bad: PtyOpen = serde_json::from_value(json!({"rows": 0, "cols": 80})).expect("parses");
    assert_eq!(
        bad.validate(),
        Err(ExecRequestError::TerminalSize { rows: 0, cols: 80 })
    );
    let huge: PtyOpen = serde_json::from_value(json!({"rows": 24, "cols": 1001})).expect("parses");
    assert!(huge.validate().is_err());
    let empty: PtyOpen =
        serde_json::from_value(json!({"argv": [], "rows": 24, "cols": 80})).expect("parses");
    assert_eq!(empty.validate(), Err(ExecRequestError::Empty("argv")));

    let input = PtyInput::PtyData {
        data: b"ls\r".to_vec(),
    };
    assert_eq!(
        serde_json::to_value(&input).expect("json"),
        json!({"kind": "pty_data", "data": "bHMN"})
    );
    assert!(PtyInput::PtyData {
        data: vec![0; MAX_PTY_DATA + 1]
    }
    .validate()
    .is_err());
    assert!(PtyInput::PtyResize { rows: 50, cols: 0 }
        .validate()
        .is_err());

    // Through the guest framing: kinds are checked, bytes survive.
    let frame = encode(&input, &[]).expect("encode");
    let (decoded, used) = decode::<PtyInput>(&frame).expect("decode").expect("whole");
    assert_eq!(used, frame.len());
    assert_eq!(decoded.message, input);
    let exit = PtyEvent::PtyExit {
        exit_code: None,
        signal: Some("SIGHUP".into()),
        duration_ms: 5,
    };
    let frame = encode(&exit, &[]).expect("encode");
    assert_eq!(
        decode::<PtyEvent>(&frame)
            .expect("decode")
            .expect("whole")
            .0
            .message,
        exit
    );
    let wrong = encode(&exit, &[]).expect("encode");
    assert!(decode::<PtyInput>(&wrong).is_err(), "events are not inputs");
}

#[test]
fn the_request_nests_in_an_internally_tagged_enum() {
    // The guest's request table tags messages by `kind`; the unknown-field
    // check must not trip over the tag.
    #[derive(Debug, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum Outer {
        Exec(ExecRequest),
    }
    let Outer::Exec(req) =
        serde_json::from_value(json!({"kind": "exec", "argv": ["true"]})).expect("parses");
    assert_eq!(req.validate(), Ok(vec!["true".into()]));
    assert!(
        serde_json::from_value::<Outer>(json!({"kind": "exec", "argv": ["true"], "x": 1})).is_err()
    );
}

/// The streamed body is byte for byte the body built whole, for output of
/// every byte value (NULs, invalid UTF-8 cut anywhere, multi-byte
/// characters) in both encodings, at lengths around base64's pieces.
#[test]
fn the_streamed_body_is_the_body_built_whole() {
    let mut state = 0x9e37_79b9_u32;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    for len in [0usize, 1, 2, 3, 4095, 12_287, 12_288, 12_289, 40_000] {
        let mut bytes: Vec<u8> = (0..len).map(|_| next().to_le_bytes()[0]).collect();
        bytes.extend_from_slice("é€😀\0\u{fffd}".as_bytes());
        let r = ExecResult {
            stdout: bytes.clone(),
            stderr: bytes[..bytes.len() / 2].to_vec(),
            ..result()
        };
        for encoding in [OutputEncoding::Utf8, OutputEncoding::Base64] {
            let whole = serde_json::to_vec(&r.to_body(encoding)).expect("json");
            let streamed = serde_json::to_vec(&r.streamed_body(encoding)).expect("json");
            assert_eq!(streamed, whole, "{len} bytes as {encoding:?}");
        }
    }
    let body = r_lossy();
    assert_eq!(body.stdout, String::from_utf8_lossy(b"ok \xff\xfe"));
}

fn r_lossy() -> ExecResultBody {
    let streamed = serde_json::to_vec(&result().streamed_body(OutputEncoding::Utf8)).expect("json");
    serde_json::from_slice(&streamed).expect("an ExecResultBody")
}
