//! The screen gateway's RFB parsers (`host-broker/http/src/screen/`): the
//! viewer's stream through the client-message filter (`rfb.rs`), in view or
//! control mode, and the desktop's answer through the server-message
//! filter (`rfb_server.rs`) with what the viewer negotiated.
//!
//! Input: a flags byte (bit 0: control; the rest seed the chunking), the
//! length of the viewer's part (u16, big-endian), the viewer's bytes, then
//! the desktop's.
//!
//! Invariants: the outcome and the bytes forwarded do not depend on how
//! the stream is cut into reads; a view connection forwards nothing it
//! would drop if it saw it again (its output passes a fresh view filter
//! unchanged, with nothing dropped); a control connection forwards no more
//! than it was sent.
#![no_main]

use dormouse_fuzz::chunks;
use dormouse_http::screen::{RfbFilter, RfbServerFilter};
use dormouse_protocol::screen::ScreenMode;
use libfuzzer_sys::fuzz_target;

fn client(mode: ScreenMode, input: &[u8], seed: &[u8]) -> (RfbFilter, Vec<u8>, Result<(), String>) {
    let mut filter = RfbFilter::new(mode);
    let mut out = Vec::new();
    let mut result = Ok(());
    for chunk in chunks(input, seed) {
        if let Err(e) = filter.feed(chunk, &mut out) {
            result = Err(e.to_string());
            break;
        }
    }
    (filter, out, result)
}

fn server(filter: &RfbFilter, input: &[u8], seed: &[u8]) -> (Vec<u8>, Result<(), String>) {
    let mut parser = RfbServerFilter::new(filter.negotiated());
    let mut out = Vec::new();
    for chunk in chunks(input, seed) {
        if let Err(e) = parser.feed(chunk, &mut out) {
            return (out, Err(e.to_string()));
        }
    }
    (out, Ok(()))
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mode = if flags & 1 == 1 {
        ScreenMode::Control
    } else {
        ScreenMode::View
    };
    let seed = [flags >> 1];
    let (viewer, desktop) = match rest {
        [a, b, tail @ ..] => {
            let len = usize::from(u16::from_be_bytes([*a, *b])).min(tail.len());
            tail.split_at(len)
        }
        _ => (rest, &[][..]),
    };

    let (whole, whole_out, whole_result) = client(mode, viewer, &[]);
    let (cut, cut_out, cut_result) = client(mode, viewer, &seed);
    assert_eq!(whole_result, cut_result, "the chunking changed the outcome");
    assert_eq!(
        whole_out, cut_out,
        "the chunking changed what was forwarded"
    );
    assert_eq!(whole.dropped(), cut.dropped());
    assert_eq!(whole.in_messages(), cut.in_messages());
    match mode {
        ScreenMode::Control => assert!(whole_out.len() <= viewer.len()),
        ScreenMode::View => {
            if whole_result.is_ok() {
                let (again, again_out, again_result) = client(mode, &whole_out, &[]);
                assert_eq!(again_result, Ok(()), "a view filter refuses its own output");
                assert_eq!(again.dropped(), 0, "a view filter forwarded input");
                assert_eq!(again_out, whole_out, "a view filter's output is not stable");
            }
        }
    }

    let (whole_server, whole_server_result) = server(&whole, desktop, &[]);
    let (cut_server, cut_server_result) = server(&cut, desktop, &seed);
    assert_eq!(
        whole_server_result, cut_server_result,
        "the chunking changed the outcome"
    );
    assert_eq!(
        whole_server, cut_server,
        "the chunking changed what was forwarded"
    );
    assert!(
        whole_server.len() <= desktop.len(),
        "the desktop filter forwarded more than it got"
    );
});
