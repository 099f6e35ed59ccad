//! The token and generation parsers (`host-broker/http/src/auth.rs`,
//! `extract.rs`, `screen_routes.rs`, `processes.rs`): a request's target
//! and headers, read for the broker's bearer token (header, `?token=`,
//! subprotocol), the screen token, and the fencing generation (the
//! `Dormouse-Generation` header and `exec/ws`'s `generation=`).
//!
//! Input: text lines; the first is the request target (`/path?query`), each
//! other `name: value` is a header (lines that are no valid header are
//! skipped; a name may repeat).
//!
//! Invariants: a token found is non-empty and holds no separator of the
//! place it came from; a token verifies against itself and not against
//! anything else; a generation accepted is the decimal number the header
//! or query spelled, and a repeated header is refused.
#![no_main]

use axum::http::{HeaderMap, HeaderName, HeaderValue, Uri};
use dormouse_http::fuzzing::{
    api_tokens, generation_header, generation_query, screen_token, ApiTokens,
};
use dormouse_http::ApiToken;
use dormouse_protocol::api::GENERATION_HEADER;
use libfuzzer_sys::fuzz_target;

fn verifies(token: &str) {
    let api = ApiToken::new(token);
    assert!(api.verify(token), "a token does not verify itself");
    assert!(!api.verify(&format!("{token}x")));
    let mut shorter = token.chars();
    shorter.next_back();
    assert!(!api.verify(shorter.as_str()));
}

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|b| *b == b'\n');
    let target = lines.next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for line in lines {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        else {
            continue;
        };
        headers.append(name, value);
    }
    let uri = std::str::from_utf8(target)
        .ok()
        .and_then(|t| t.parse::<Uri>().ok());
    let path = uri.as_ref().map_or("/", Uri::path);
    let query = uri.as_ref().and_then(Uri::query);

    let ApiTokens {
        bearer,
        query: from_query,
        subprotocol,
        browser_socket: _,
    } = api_tokens(&headers, path, query);
    if let Some(t) = &bearer {
        assert!(!t.is_empty() && t.trim() == t, "bearer {t:?}");
        verifies(t);
    }
    if let Some(t) = &from_query {
        assert!(!t.is_empty());
        verifies(t);
    }
    if let Some(t) = &subprotocol {
        assert!(
            !t.is_empty() && !t.contains(',') && t.trim() == t,
            "subprotocol {t:?}"
        );
        verifies(t);
    }
    // From the subprotocol list a token holds no comma; from `?token=` it
    // may (percent-decoded, it then matches no minted token).
    if let Some(t) = screen_token(&headers, None) {
        assert!(!t.is_empty() && !t.contains(',') && t.trim() == t, "{t:?}");
    }
    if let Some(t) = screen_token(&headers, query) {
        assert!(!t.is_empty());
        verifies(&t);
    }

    let sent: Vec<&HeaderValue> = headers.get_all(GENERATION_HEADER).iter().collect();
    match generation_header(&headers) {
        Ok(None) => assert!(sent.is_empty()),
        Ok(Some(n)) => {
            assert_eq!(sent.len(), 1, "a repeated generation was taken");
            let text = sent[0].to_str().unwrap_or_default().trim();
            assert_eq!(text.parse::<u64>().ok(), Some(n));
            assert!(text.bytes().all(|b| b.is_ascii_digit()), "{text:?} taken");
        }
        Err(status) => assert_eq!(status, 400),
    }
    if let Some(uri) = &uri {
        match generation_query(uri) {
            Some(Ok(Some(n))) => {
                assert!(uri.query().is_some_and(|q| q.contains("generation=")));
                let _ = n;
            }
            Some(Err(status)) => assert_eq!(status, 400),
            _ => {}
        }
    }
});
