use super::*;
use crate::frame::{self, frame_unchecked};
use crate::{Answer as _, Response};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn open(host: &str, port: u16, form: EgressForm) -> EgressOpen {
    EgressOpen {
        id: 7,
        host: host.into(),
        port,
        form,
        hand_over: false,
    }
}

#[test]
fn hosts_are_names_or_literals() {
    for good in [
        "example.com",
        "testsite.invalid",
        "a",
        "x-y.z_w.example",
        "127.0.0.1",
        "203.0.113.7",
        "::1",
        "2001:db8::1",
        &"a".repeat(63),
        &format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        ),
    ] {
        assert_eq!(check_host(good), Ok(()), "{good}");
    }
    for bad in [
        "",
        "Example.com",
        "example.com.",
        ".example.com",
        "a..b",
        "-a.b",
        "a-.b",
        "exa mple.com",
        "evil\r\nHost: x",
        "evil\u{1b}[2J",
        "é.example",
        "a/b",
        "a@b",
        "[::1]",
        "1.2.3",
        "999.1.1.1",
        "::zz",
        &"a".repeat(64),
        &format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(62)
        ),
    ] {
        let err = check_host(bad).expect_err(bad);
        assert!(!err.to_string().chars().any(frame::is_hazardous), "{err}");
    }
}

#[test]
fn open_validates_port_and_method() {
    assert_eq!(open("a.b", 443, EgressForm::Connect).validate(), Ok(()));
    assert_eq!(
        open("a.b", 0, EgressForm::Connect).validate(),
        Err(EgressError::Port)
    );
    let http = |m: &str| EgressForm::Http { method: m.into() };
    assert_eq!(open("a.b", 80, http("GET")).validate(), Ok(()));
    assert_eq!(open("a.b", 80, http("PROPFIND")).validate(), Ok(()));
    for bad in ["", "G ET", "GET\r\n", "connect", &"A".repeat(33)] {
        assert!(
            matches!(
                open("a.b", 80, http(bad)).validate(),
                Err(EgressError::Method(_))
            ),
            "{bad:?}"
        );
    }
    assert_eq!(
        open("::1", 8080, EgressForm::Connect).authority(),
        "[::1]:8080"
    );
    assert_eq!(open("a.b", 80, EgressForm::Connect).authority(), "a.b:80");
}

#[test]
fn the_wire_form_is_the_documented_one() {
    let response = open(
        "a.b",
        80,
        EgressForm::Http {
            method: "GET".into(),
        },
    )
    .into_response();
    let bytes = frame::encode(&response, b"GET / HTTP/1.1\r\n\r\n").expect("encode");
    let json: serde_json::Value =
        serde_json::from_slice(&bytes[frame::HEADER_LEN..bytes.len() - 18]).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"v": 1, "kind": "egress_open", "id": 7, "host": "a.b", "port": 80,
            "form": {"type": "http", "method": "GET"}})
    );
    let (decoded, _) = frame::decode::<Response>(&bytes)
        .expect("decode")
        .expect("whole");
    assert_eq!(decoded.message, response);
    assert_eq!(decoded.payload, b"GET / HTTP/1.1\r\n\r\n");
    let verdict = frame::encode(
        &EgressVerdict::Refused {
            reason: "denied".into(),
        },
        &[],
    )
    .expect("encode");
    let json: serde_json::Value =
        serde_json::from_slice(&verdict[frame::HEADER_LEN..]).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"v": 1, "kind": "egress_refused", "reason": "denied"})
    );
    let connected = frame::encode(&EgressVerdict::Connected, &[]).expect("encode");
    let json: serde_json::Value =
        serde_json::from_slice(&connected[frame::HEADER_LEN..]).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"v": 1, "kind": "egress_connected"})
    );
}

#[tokio::test]
async fn bytes_after_the_verdict_stay_for_the_relay() {
    let (mut broker, mut guest) = tokio::io::duplex(1 << 16);
    // The verdict and the first upstream bytes in one write, as a fast
    // upstream may make them arrive.
    let mut wire = frame::encode(&EgressVerdict::Connected, &[]).expect("encode");
    wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\nhello");
    broker.write_all(&wire).await.expect("write");
    assert_eq!(
        read_verdict(&mut guest).await.expect("verdict"),
        EgressVerdict::Connected
    );
    let mut rest = vec![0u8; 24];
    guest.read_exact(&mut rest).await.expect("rest");
    assert_eq!(rest, b"HTTP/1.1 200 OK\r\n\r\nhello");
}

#[tokio::test]
async fn hostile_verdicts_are_tamed_or_refused() {
    let (mut broker, mut guest) = tokio::io::duplex(1 << 16);
    let reason = format!("line\r\nSet-Cookie: x\u{1b}[2J{}", "y".repeat(1000));
    write_verdict(
        &mut broker,
        &EgressVerdict::Failed { reason },
        Duration::from_secs(1),
    )
    .await
    .expect("write");
    let EgressVerdict::Failed { reason } = read_verdict(&mut guest).await.expect("verdict") else {
        panic!("kind");
    };
    assert!(reason.len() <= MAX_REASON_LEN, "{}", reason.len());
    assert!(!reason.chars().any(frame::is_hazardous), "{reason:?}");
    assert!(reason.starts_with("line\\r\\nSet-Cookie"), "{reason:?}");
    // A payload, another kind, a huge message: refused.
    for bad in [
        frame_unchecked(br#"{"v":1,"kind":"egress_connected"}"#, b"x"),
        frame_unchecked(br#"{"v":1,"kind":"pty_output","data":""}"#, b""),
        frame_unchecked(&vec![b' '; 5000], b""),
    ] {
        let (mut broker, mut guest) = tokio::io::duplex(1 << 16);
        broker.write_all(&bad).await.expect("write");
        assert!(read_verdict(&mut guest).await.is_err());
    }
}

#[tokio::test(start_paused = true)]
async fn a_silent_broker_meets_the_verdict_deadline() {
    let (_broker, mut guest) = tokio::io::duplex(64);
    assert!(matches!(
        read_verdict(&mut guest).await,
        Err(crate::stream::StreamError::Idle(VERDICT_TIMEOUT))
    ));
}
