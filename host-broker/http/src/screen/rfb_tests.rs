use super::*;
use rand::{Rng, SeedableRng};

fn handshake() -> Vec<u8> {
    let mut v = b"RFB 003.008\n".to_vec();
    v.push(1); // security None
    v.push(0); // ClientInit, exclusive (rewritten to shared)
    v
}

fn set_encodings(list: &[i32]) -> Vec<u8> {
    let mut v = vec![2, 0];
    v.extend_from_slice(&u16::try_from(list.len()).unwrap().to_be_bytes());
    for e in list {
        v.extend_from_slice(&e.to_be_bytes());
    }
    v
}

fn key(down: bool, keysym: u32) -> Vec<u8> {
    let mut v = vec![4, u8::from(down), 0, 0];
    v.extend_from_slice(&keysym.to_be_bytes());
    v
}

fn pointer(mask: u8, x: u16, y: u16) -> Vec<u8> {
    let mut v = vec![5, mask];
    v.extend_from_slice(&x.to_be_bytes());
    v.extend_from_slice(&y.to_be_bytes());
    v
}

fn cut_text(text: &[u8]) -> Vec<u8> {
    let mut v = vec![6, 0, 0, 0];
    v.extend_from_slice(&u32::try_from(text.len()).unwrap().to_be_bytes());
    v.extend_from_slice(text);
    v
}

fn update_request(incremental: bool) -> Vec<u8> {
    let mut v = vec![3, u8::from(incremental)];
    for n in [0u16, 0, 1280, 800] {
        v.extend_from_slice(&n.to_be_bytes());
    }
    v
}

fn pixel_format(bpp: u8) -> Vec<u8> {
    let mut v = vec![
        0, 0, 0, 0, bpp, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0,
    ];
    v.truncate(20);
    v
}

fn qemu_key() -> Vec<u8> {
    vec![255, 0, 0, 1, 0, 0, 0, 0x61, 0, 0, 0, 30]
}

/// A session mixing every kind, with what view and control must forward.
fn session() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let mut all = handshake();
    let mut view = b"RFB 003.008\n".to_vec();
    view.extend_from_slice(&[1, 1]);
    let mut control = view.clone();
    let harmless = [
        pixel_format(32),
        set_encodings(&[0, 1, 5, 7, 16, -223, -224, -258, -313, -314, 0x574d5664]),
        update_request(false),
        vec![150, 1, 0, 0, 0, 0, 5, 0, 3, 32],
        {
            let mut f = vec![248, 0, 0, 0, 0, 0, 0, 3, 4];
            f.extend_from_slice(b"abcd");
            f
        },
        vec![255, 1, 0, 0],
    ];
    let input = [
        key(true, 0x61),
        key(false, 0x61),
        pointer(1, 100, 200),
        pointer(0, 100, 200),
        cut_text(b"secret clipboard"),
        qemu_key(),
        // xvp version 1, shutdown.
        vec![250, 0, 1, 2],
        {
            let mut d = vec![251, 0, 4, 0, 3, 0, 1, 0];
            d.extend_from_slice(&[0u8; 16]);
            d
        },
    ];
    for (h, i) in harmless.iter().zip(input.iter()) {
        all.extend_from_slice(h);
        if h[0] == 2 {
            // View asks only for what the server side can frame.
            view.extend_from_slice(&set_encodings(&[0, 1, 5, 16, -223, -224, -258, -313]));
        } else {
            view.extend_from_slice(h);
        }
        control.extend_from_slice(h);
        all.extend_from_slice(i);
        control.extend_from_slice(i);
    }
    for i in &input[harmless.len()..] {
        all.extend_from_slice(i);
        control.extend_from_slice(i);
    }
    all.extend_from_slice(&update_request(true));
    view.extend_from_slice(&update_request(true));
    control.extend_from_slice(&update_request(true));
    (all, view, control)
}

fn run(mode: ScreenMode, chunks: &[&[u8]]) -> Result<Vec<u8>, RfbViolation> {
    let mut f = RfbFilter::new(mode);
    let mut out = Vec::new();
    for c in chunks {
        f.feed(c, &mut out)?;
    }
    Ok(out)
}

#[test]
fn the_first_whole_screen_request_is_handed_out_once_at_a_boundary() {
    let mut filter = RfbFilter::new(ScreenMode::View);
    let mut out = Vec::new();
    let mut input = handshake();
    input.extend_from_slice(&update_request(true));
    filter.feed(&input, &mut out).unwrap();
    assert_eq!(filter.take_first_full_request(), None, "incremental only");
    let full = update_request(false);
    filter.feed(&full[..4], &mut out).unwrap();
    assert!(!filter.at_message_boundary(), "inside a message");
    filter.feed(&full[4..], &mut out).unwrap();
    assert!(filter.at_message_boundary());
    assert_eq!(
        filter.take_first_full_request().map(|r| r.to_vec()),
        Some(full.clone())
    );
    filter.feed(&full, &mut out).unwrap();
    assert_eq!(filter.take_first_full_request(), None, "handed out once");
}

#[test]
fn the_first_request_for_updates_is_located_in_the_output_once() {
    for mode in [ScreenMode::View, ScreenMode::Control] {
        let mut filter = RfbFilter::new(mode);
        let mut out = Vec::new();
        filter.feed(&handshake(), &mut out).unwrap();
        assert_eq!(filter.take_first_ask_offset(), None, "no request yet");
        // Whatever precedes the request in one read goes first; the
        // request of either kind starts where the offset says.
        out.clear();
        let mut input = vec![
            0, 0, 0, 0, 32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0,
        ];
        let incremental = update_request(true);
        input.extend_from_slice(&incremental);
        input.extend_from_slice(&update_request(false));
        filter.feed(&input, &mut out).unwrap();
        let at = filter.take_first_ask_offset().expect("the request");
        assert_eq!(&out[at..at + 10], &incremental[..], "{mode:?}");
        assert_eq!(filter.take_first_ask_offset(), None, "handed out once");
        out.clear();
        filter.feed(&update_request(false), &mut out).unwrap();
        assert_eq!(filter.take_first_ask_offset(), None, "only the first");
    }
}

#[test]
fn view_drops_input_and_control_forwards_it_over_any_chunking() {
    let (all, view, control) = session();
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    for round in 0..2000 {
        let mut chunks = Vec::new();
        let mut rest = all.as_slice();
        while !rest.is_empty() {
            let max = if round % 3 == 0 { 3 } else { 64 };
            let n = rng.gen_range(1..=max).min(rest.len());
            chunks.push(&rest[..n]);
            rest = &rest[n..];
        }
        assert_eq!(
            run(ScreenMode::View, &chunks).unwrap(),
            view,
            "round {round}"
        );
        assert_eq!(
            run(ScreenMode::Control, &chunks).unwrap(),
            control,
            "round {round}"
        );
    }
    let mut f = RfbFilter::new(ScreenMode::View);
    f.feed(&all, &mut Vec::new()).unwrap();
    assert_eq!(f.dropped(), 8);
}

#[test]
fn rfb_3_3_has_no_security_byte() {
    let mut s = b"RFB 003.003\n".to_vec();
    s.push(0);
    s.extend_from_slice(&pointer(1, 1, 1));
    s.extend_from_slice(&update_request(true));
    let mut want = b"RFB 003.003\n".to_vec();
    want.push(1);
    want.extend_from_slice(&update_request(true));
    assert_eq!(run(ScreenMode::View, &[&s]).unwrap(), want);
}

#[test]
fn malformed_handshakes_are_refused() {
    for bad in [
        &b"RFB 003.889\n"[..],
        b"RFB 004.000\n",
        b"GET / HTTP/1.1\r\n",
        b"\0\0\0\0\0\0\0\0\0\0\0\0",
    ] {
        assert_eq!(
            run(ScreenMode::Control, &[bad]),
            Err(RfbViolation::BadVersion)
        );
    }
    let mut s = b"RFB 003.008\n".to_vec();
    s.push(2);
    assert_eq!(
        run(ScreenMode::Control, &[&s]),
        Err(RfbViolation::BadSecurity(2))
    );
    // Nothing is forwarded before the version is whole and checked.
    let mut f = RfbFilter::new(ScreenMode::Control);
    let mut out = Vec::new();
    f.feed(b"RFB 003.0", &mut out).unwrap();
    assert!(out.is_empty());
}

#[test]
fn oversized_and_unknown_messages_end_the_connection() {
    let h = handshake();
    let mut enc = set_encodings(&[]);
    enc[2..4].copy_from_slice(&(MAX_ENCODINGS + 1).to_be_bytes());
    let mut cut = vec![6, 0, 0, 0];
    cut.extend_from_slice(&(MAX_CUT_TEXT + 1).to_be_bytes());
    let mut neg_cut = vec![6, 0, 0, 0];
    neg_cut.extend_from_slice(&i32::MIN.to_be_bytes());
    for (msg, want) in [
        (enc, RfbViolation::TooManyEncodings(MAX_ENCODINGS + 1)),
        (cut, RfbViolation::CutTextTooLong(MAX_CUT_TEXT + 1)),
        (neg_cut, RfbViolation::CutTextTooLong(1 << 31)),
        (vec![7], RfbViolation::UnknownMessage(7)),
        // gii (252) has a length of its own; nothing noVNC sends.
        (vec![252, 0, 0, 4], RfbViolation::UnknownMessage(252)),
        (vec![255, 9], RfbViolation::UnknownQemu(9)),
        (vec![255, 1, 0, 7], RfbViolation::UnknownQemu(7)),
        (pixel_format(24), RfbViolation::BadPixelFormat(24)),
        (
            vec![248, 0, 0, 0, 0, 0, 0, 0, 65],
            RfbViolation::FenceTooLong(65),
        ),
        (
            vec![251, 0, 0, 1, 0, 1, 17, 0],
            RfbViolation::TooManyScreens(17),
        ),
    ] {
        for mode in [ScreenMode::View, ScreenMode::Control] {
            assert_eq!(run(mode, &[&h, &msg]), Err(want.clone()));
        }
    }
}

#[test]
fn random_garbage_is_refused_quickly_and_bounded() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1986);
    for _ in 0..500 {
        let mut garbage = handshake();
        let n = rng.gen_range(1..4096);
        garbage.extend((0..n).map(|_| rng.gen::<u8>()));
        let mut f = RfbFilter::new(ScreenMode::Control);
        let mut out = Vec::new();
        // Either an error, or whatever passed was parsed; never more
        // than one message's fixed part held.
        let _ = f.feed(&garbage, &mut out);
        assert!(f.pending.len() <= 4 + 4 * usize::from(MAX_ENCODINGS));
        assert!(out.len() <= garbage.len());
    }
    // 10 MiB of bytes: the first unknown type ends it.
    let mut f = RfbFilter::new(ScreenMode::View);
    let mut out = Vec::new();
    f.feed(&handshake(), &mut out).unwrap();
    let junk = vec![0xA5u8; 10 * 1024 * 1024];
    assert_eq!(
        f.feed(&junk, &mut out),
        Err(RfbViolation::UnknownMessage(0xA5))
    );
}

#[test]
fn view_drops_clipboard_text_streamed_in_pieces() {
    let mut text = vec![b'x'; 300_000];
    text[0] = b'A';
    let mut s = handshake();
    s.extend_from_slice(&cut_text(&text));
    s.extend_from_slice(&update_request(true));
    let chunks: Vec<&[u8]> = s.chunks(4093).collect();
    let out = run(ScreenMode::View, &chunks).unwrap();
    let mut want = b"RFB 003.008\n".to_vec();
    want.extend_from_slice(&[1, 1]);
    want.extend_from_slice(&update_request(true));
    assert_eq!(out, want);
    let out = run(ScreenMode::Control, &chunks).unwrap();
    assert_eq!(out.len(), want.len() + 8 + text.len());
}

#[test]
fn view_set_encodings_keep_only_what_the_server_side_frames() {
    // noVNC 1.3's list, plus ZRLE and the extended clipboard.
    let novnc = [
        1,
        7,
        -260,
        5,
        2,
        16,
        0,
        -26,
        -250,
        -223,
        -224,
        -258,
        -308,
        -309,
        -312,
        -313,
        -307,
        i32::from_be_bytes(0xC0A1_E5CE_u32.to_be_bytes()),
        0x574d_5664,
        -239,
    ];
    let kept = [1, 5, 16, 0, -223, -224, -258, -308, -312, -313, -307, -239];
    let mut s = handshake();
    s.extend_from_slice(&set_encodings(&novnc));
    let mut want = b"RFB 003.008\n".to_vec();
    want.extend_from_slice(&[1, 1]);
    let mut control = want.clone();
    want.extend_from_slice(&set_encodings(&kept));
    control.extend_from_slice(&set_encodings(&novnc));
    for cut in 0..=s.len() {
        let (a, b) = s.split_at(cut);
        assert_eq!(
            run(ScreenMode::View, &[a, b]).unwrap(),
            want,
            "cut at {cut}"
        );
        assert_eq!(run(ScreenMode::Control, &[a, b]).unwrap(), control);
    }
    // Nothing frameable asked for: an empty list (the server sends Raw).
    let mut s = handshake();
    s.extend_from_slice(&set_encodings(&[
        7,
        2,
        i32::from_be_bytes(0xC0A1_E5CE_u32.to_be_bytes()),
    ]));
    let out = run(ScreenMode::View, &[&s]).unwrap();
    assert_eq!(&out[14..], &set_encodings(&[])[..]);
}

#[test]
fn the_pixel_format_is_shared_and_a_view_cannot_change_it_after_updates() {
    let mut f = RfbFilter::new(ScreenMode::View);
    let negotiated = f.negotiated();
    assert_eq!(negotiated.minor(), None);
    let mut out = Vec::new();
    f.feed(&handshake(), &mut out).unwrap();
    assert_eq!(negotiated.minor(), Some(8));
    assert_eq!(negotiated.bits_per_pixel(), None);
    f.feed(&pixel_format(16), &mut out).unwrap();
    f.feed(&pixel_format(8), &mut out).unwrap();
    assert_eq!(negotiated.bits_per_pixel(), Some(8));
    f.feed(&update_request(true), &mut out).unwrap();
    assert_eq!(
        f.feed(&pixel_format(32), &mut out),
        Err(RfbViolation::PixelFormatChange)
    );
    // Control may (its server side is not framed).
    let mut f = RfbFilter::new(ScreenMode::Control);
    let mut s = handshake();
    s.extend_from_slice(&update_request(true));
    s.extend_from_slice(&pixel_format(16));
    run_ok(&mut f, &s);
    assert_eq!(f.negotiated().bits_per_pixel(), Some(16));
}

fn run_ok(f: &mut RfbFilter, s: &[u8]) {
    f.feed(s, &mut Vec::new()).unwrap();
}
