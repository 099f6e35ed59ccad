//! The egress proxy's request parser (`guest-supervisor/src/egress/head.rs`):
//! a guest program's bytes read as a request head (bounded, in the chunks
//! the input asks for) and parsed into what the proxy asks the broker for.
//!
//! Input: a chunking byte, then the program's bytes.
//!
//! Invariants: the request read does not depend on the chunking; what the guest's
//! parser accepts, the broker's check of an `egress_open` accepts too
//! (same host, port, method); a rewritten plain-HTTP head is one head (one
//! blank line, at its end; no bare CR or LF; no `Proxy-*` header), and it
//! parses again as an origin-form request of the same method.
#![no_main]

use dormouse_fuzz::{runtime, ChunkedReader};
use dormouse_protocol::egress::{EgressForm, EgressOpen};
use dormouse_supervisor::egress::head::{parse, read_head, ProxyRequest};
use libfuzzer_sys::fuzz_target;
use tokio::time::{Duration, Instant};

/// What the proxy makes of a program's bytes: the head read, then parsed
/// (the bytes after the head depend on the reads, and are not compared).
fn read(data: &[u8], seed: &[u8]) -> Option<ProxyRequest> {
    let mut reader = ChunkedReader::new(data, seed);
    let deadline = Instant::now() + Duration::from_secs(5);
    let (head, _early) = runtime().block_on(read_head(&mut reader, deadline)).ok()?;
    parse(&head).ok()
}

fn check_request(request: &ProxyRequest) {
    let open = EgressOpen {
        id: 1,
        host: request.host.clone(),
        port: request.port,
        form: request.form.clone(),
        hand_over: true,
    };
    if let Err(e) = open.validate() {
        panic!("the proxy took {request:?}, the broker refuses it: {e}");
    }
    assert_ne!(request.port, 0);
    match &request.form {
        EgressForm::Connect => assert!(request.upstream_head.is_empty()),
        EgressForm::Http { method } => {
            let head = &request.upstream_head;
            assert!(head.ends_with(b"\r\n\r\n"), "an unterminated upstream head");
            let body = &head[..head.len() - 4];
            assert!(
                !body.windows(4).any(|w| w == b"\r\n\r\n"),
                "a second head hides in the upstream head: {:?}",
                String::from_utf8_lossy(head)
            );
            for (i, b) in head.iter().enumerate() {
                match b {
                    b'\n' => assert!(i > 0 && head[i - 1] == b'\r', "a bare LF upstream"),
                    b'\r' => assert_eq!(head.get(i + 1), Some(&b'\n'), "a bare CR upstream"),
                    _ => {}
                }
            }
            let text = String::from_utf8_lossy(head).to_ascii_lowercase();
            assert!(
                // The header lines: a method may start with `Proxy-` too.
                !text.split("\r\n").skip(1).any(|l| l.starts_with("proxy-")),
                "a Proxy- header went upstream"
            );
            let line = text.split("\r\n").next().unwrap_or_default();
            assert!(line.starts_with(&format!("{} /", method.to_ascii_lowercase())));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, program)) = data.split_first() else {
        return;
    };
    let whole = read(program, &[]);
    let cut = read(program, &[seed]);
    assert_eq!(whole, cut, "the chunking changed the request read");
    if let Some(request) = &whole {
        check_request(request);
    }
    // The parser alone, on any bytes.
    if let Ok(request) = parse(program) {
        check_request(&request);
    }
});
