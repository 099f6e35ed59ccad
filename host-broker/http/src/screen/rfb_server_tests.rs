use super::*;
use crate::screen::rfb::RfbFilter;
use dormouse_protocol::screen::ScreenMode;
use rand::{Rng, SeedableRng};

/// A server filter whose viewer chose `version` and, if given, a pixel size.
fn server(version: &[u8; 12], bpp: Option<u8>) -> RfbServerFilter {
    let mut client = RfbFilter::new(ScreenMode::View);
    let mut sent = version.to_vec();
    if version != b"RFB 003.003\n" {
        sent.push(1);
    }
    sent.push(1);
    if let Some(bpp) = bpp {
        sent.extend_from_slice(&[0, 0, 0, 0, bpp, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0]);
        sent.extend_from_slice(&[0, 0, 0]);
    }
    client.feed(&sent, &mut Vec::new()).unwrap();
    RfbServerFilter::new(client.negotiated())
}

fn server_init(bpp: u8, name: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&1280u16.to_be_bytes());
    v.extend_from_slice(&800u16.to_be_bytes());
    v.extend_from_slice(&[bpp, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0]);
    v.extend_from_slice(&u32::try_from(name.len()).unwrap().to_be_bytes());
    v.extend_from_slice(name);
    v
}

/// RFB 3.8's greeting up to and with ServerInit.
fn greeting() -> Vec<u8> {
    let mut v = b"RFB 003.008\n".to_vec();
    v.extend_from_slice(&[1, 1]);
    v.extend_from_slice(&0u32.to_be_bytes());
    v.extend_from_slice(&server_init(32, b"desk:1"));
    v
}

fn rect(w: u16, h: u16, encoding: i32) -> Vec<u8> {
    let mut v = vec![0, 1, 0, 2];
    v.extend_from_slice(&w.to_be_bytes());
    v.extend_from_slice(&h.to_be_bytes());
    v.extend_from_slice(&encoding.to_be_bytes());
    v
}

fn update(count: u16, rects: &[Vec<u8>]) -> Vec<u8> {
    let mut v = vec![0, 0];
    v.extend_from_slice(&count.to_be_bytes());
    for r in rects {
        v.extend_from_slice(r);
    }
    v
}

fn cut_text(len: i32, text: &[u8]) -> Vec<u8> {
    let mut v = vec![3, 0, 0, 0];
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(text);
    v
}

/// Every message type and rectangle kind at 32 bits per pixel, with the
/// clipboard at three places; and what a view must receive of it.
fn session() -> (Vec<u8>, Vec<u8>) {
    let mut raw = rect(2, 3, 0);
    raw.extend_from_slice(&[0x11; 24]);
    let mut copy = rect(8, 8, 1);
    copy.extend_from_slice(&[0, 4, 0, 5]);
    let mut zrle = rect(64, 64, 16);
    zrle.extend_from_slice(&5u32.to_be_bytes());
    zrle.extend_from_slice(b"zlib!");
    let mut cursor = rect(9, 2, -239);
    // 9×2 pixels of 4 bytes, then a mask of 2 bytes a row.
    cursor.extend_from_slice(&[0xCC; 72 + 4]);
    let mut ext = rect(1280, 800, -308);
    ext.extend_from_slice(&[1, 0, 0, 0]);
    ext.extend_from_slice(&[0x22; 16]);
    // Hextile, 20×17: four tiles (16×16, 4×16, 16×1, 4×1), one of each
    // kind: raw, background + foreground + two subrects, one coloured
    // subrect, nothing (the background goes on).
    let mut hextile = rect(20, 17, 5);
    hextile.push(1);
    hextile.extend_from_slice(&[0x55; 16 * 16 * 4]);
    hextile.push(2 | 4 | 8);
    hextile.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 2, 0x00, 0x11, 0x22, 0x33]);
    hextile.push(8 | 16);
    hextile.extend_from_slice(&[1, 9, 9, 9, 9, 0x01, 0x00]);
    hextile.push(0);
    let mut name = rect(0, 0, -307);
    name.extend_from_slice(&4u32.to_be_bytes());
    name.extend_from_slice(b"desk");
    let first = update(
        9,
        &[
            hextile,
            raw.clone(),
            copy,
            zrle,
            rect(1280, 800, -223),
            cursor,
            ext,
            name,
            rect(0, 0, -258),
        ],
    );
    let last = update(0xFFFF, &[raw.clone(), raw, rect(0, 0, -224)]);
    let mut colours = vec![1, 0, 0, 0, 0, 2];
    colours.extend_from_slice(&[0x33; 12]);
    let mut fence = vec![248, 0, 0, 0, 0, 0, 0, 1, 4];
    fence.extend_from_slice(b"abcd");
    let secret = cut_text(10, b"secret-123");
    let extended = cut_text(-13, b"\0\0\0\x01zlibbytes");
    let empty = cut_text(0, b"");
    let mut all = greeting();
    let mut view = greeting();
    for (message, kept) in [
        (update(0, &[]), true),
        (secret, false),
        (first, true),
        (colours, true),
        (extended, false),
        (vec![2], true),
        (last, true),
        (empty, false),
        (vec![150], true),
        (fence, true),
        (
            update(1, &[[rect(1, 1, 0), vec![0, 0, 0, 0]].concat()]),
            true,
        ),
    ] {
        all.extend_from_slice(&message);
        if kept {
            view.extend_from_slice(&message);
        }
    }
    (all, view)
}

fn run(f: &mut RfbServerFilter, chunks: &[&[u8]]) -> Result<Vec<u8>, RfbServerViolation> {
    let mut out = Vec::new();
    for c in chunks {
        f.feed(c, &mut out)?;
    }
    Ok(out)
}

const V38: &[u8; 12] = b"RFB 003.008\n";

#[test]
fn every_message_is_framed_and_the_clipboard_cut_at_every_boundary() {
    let (all, view) = session();
    for cut in 0..=all.len() {
        let (a, b) = all.split_at(cut);
        let mut f = server(V38, None);
        assert_eq!(run(&mut f, &[a, b]).unwrap(), view, "cut at {cut}");
        assert_eq!(f.dropped_cut_text(), 3);
        assert_eq!(f.updates(), 4);
    }
    let bytes: Vec<&[u8]> = all.chunks(1).collect();
    assert_eq!(run(&mut server(V38, None), &bytes).unwrap(), view);
}

#[test]
fn any_chunking_gives_the_same_stream_and_nothing_is_held() {
    let (all, view) = session();
    let mut rng = rand::rngs::StdRng::seed_from_u64(6143);
    for round in 0..1000 {
        let mut f = server(V38, None);
        let mut out = Vec::new();
        let mut rest = all.as_slice();
        while !rest.is_empty() {
            let n = rng
                .gen_range(1..=if round % 2 == 0 { 5 } else { 200 })
                .min(rest.len());
            f.feed(&rest[..n], &mut out).unwrap();
            assert!(f.pending.len() <= 256);
            rest = &rest[n..];
        }
        assert_eq!(out, view, "round {round}");
    }
}

#[test]
fn a_large_update_streams_through_without_being_held() {
    let mut f = server(V38, None);
    let mut out = Vec::new();
    f.feed(&greeting(), &mut out).unwrap();
    let mut head = update(1, &[rect(1280, 800, 0)]);
    head.truncate(16);
    f.feed(&head, &mut out).unwrap();
    let chunk = vec![0x44u8; 64 * 1024];
    let mut left = 1280 * 800 * 4;
    while left > 0 {
        let n = left.min(chunk.len());
        out.clear();
        f.feed(&chunk[..n], &mut out).unwrap();
        assert_eq!(out.len(), n, "payload passes as it comes");
        assert!(f.pending.capacity() <= 256);
        left -= n;
    }
    out.clear();
    f.feed(&cut_text(3, b"abc"), &mut out).unwrap();
    f.feed(&[2], &mut out).unwrap();
    assert_eq!(out, vec![2], "the update ended where its size said");
}

#[test]
fn the_viewers_pixel_size_frames_raw_and_cursor() {
    // 16 bits a pixel, set by the viewer over ServerInit's 32.
    let mut f = server(V38, Some(16));
    let mut raw = rect(3, 1, 0);
    raw.extend_from_slice(&[9; 6]);
    let mut cursor = rect(3, 1, -239);
    cursor.extend_from_slice(&[9; 7]);
    let mut s = greeting();
    s.extend_from_slice(&update(2, &[raw, cursor]));
    s.extend_from_slice(&cut_text(1, b"x"));
    let mut want = greeting();
    want.extend_from_slice(&s[want.len()..s.len() - 9]);
    assert_eq!(run(&mut f, &[&s]).unwrap(), want);
    // 8 bits (a colour map), from ServerInit alone.
    let mut f = server(V38, None);
    let mut g = b"RFB 003.008\n".to_vec();
    g.extend_from_slice(&[1, 1, 0, 0, 0, 0]);
    g.extend_from_slice(&server_init(8, b""));
    let mut raw = rect(2, 2, 0);
    raw.extend_from_slice(&[1, 2, 3, 4]);
    g.extend_from_slice(&update(1, &[raw]));
    g.push(2);
    assert_eq!(run(&mut f, &[&g]).unwrap(), g);
}

#[test]
fn older_handshakes_and_failures_are_framed() {
    // 3.3: the server decides, a u32.
    let mut s = b"RFB 003.008\n".to_vec();
    s.extend_from_slice(&1u32.to_be_bytes());
    s.extend_from_slice(&server_init(32, b"n"));
    s.push(2);
    assert_eq!(
        run(&mut server(b"RFB 003.003\n", None), &[&s]).unwrap(),
        s,
        "the lower version of the two is spoken"
    );
    // 3.7: no SecurityResult after None.
    let mut s = b"RFB 003.007\n".to_vec();
    s.extend_from_slice(&[2, 2, 1]);
    s.extend_from_slice(&server_init(32, b"n"));
    s.push(2);
    assert_eq!(run(&mut server(b"RFB 003.007\n", None), &[&s]).unwrap(), s);
    // Failures carry their reason, then nothing more.
    for (version, head) in [
        (V38, &[0u8][..]),
        (V38, &[1, 1, 0, 0, 0, 1][..]),
        (b"RFB 003.003\n", &[0, 0, 0, 0][..]),
    ] {
        let mut s = version.to_vec();
        s.extend_from_slice(head);
        s.extend_from_slice(&4u32.to_be_bytes());
        s.extend_from_slice(b"full");
        let mut f = server(version, None);
        assert_eq!(run(&mut f, &[&s]).unwrap(), s);
        assert_eq!(
            f.feed(&[0], &mut Vec::new()),
            Err(RfbServerViolation::AfterFailure)
        );
    }
}

#[test]
fn what_it_cannot_frame_ends_the_connection() {
    let mut client = RfbFilter::new(ScreenMode::View);
    let mut f = RfbServerFilter::new(client.negotiated());
    let mut s = V38.to_vec();
    s.extend_from_slice(&[1, 1]);
    assert_eq!(run(&mut f, &[&s]), Err(RfbServerViolation::SpokeFirst));
    client.feed(V38, &mut Vec::new()).unwrap();

    let bad_version: &[u8] = b"RFB 003.889\n";
    assert_eq!(
        run(&mut server(V38, None), &[bad_version]),
        Err(RfbServerViolation::BadVersion)
    );
    let mut s = V38.to_vec();
    s.extend_from_slice(&[1, 1, 0, 0, 0, 2]);
    assert_eq!(
        run(&mut server(V38, None), &[&s]),
        Err(RfbServerViolation::BadSecurity(2))
    );
    let mut s = V38.to_vec();
    s.extend_from_slice(&[1, 1, 0, 0, 0, 0]);
    let mut init = server_init(24, b"");
    s.extend_from_slice(&init);
    assert_eq!(
        run(&mut server(V38, None), &[&s]),
        Err(RfbServerViolation::BadPixelFormat(24))
    );
    init = server_init(32, b"");
    init[20..24].copy_from_slice(&(MAX_NAME + 1).to_be_bytes());
    s.truncate(18);
    s.extend_from_slice(&init);
    assert_eq!(
        run(&mut server(V38, None), &[&s]),
        Err(RfbServerViolation::StringTooLong(MAX_NAME + 1))
    );
    let mut zrle = rect(1, 1, 16);
    zrle.extend_from_slice(&(MAX_ZRLE + 1).to_be_bytes());
    let mut fence = vec![248, 0, 0, 0, 0, 0, 0, 0, 65];
    fence.extend_from_slice(&[0; 65]);
    for (message, want) in [
        // Tight, RRE, the extended clipboard's and xvp's: not framed.
        (
            update(1, &[rect(1, 1, 7)]),
            RfbServerViolation::UnknownEncoding(7),
        ),
        (
            update(1, &[rect(1, 1, 2)]),
            RfbServerViolation::UnknownEncoding(2),
        ),
        (
            update(
                1,
                &[rect(
                    1,
                    1,
                    i32::from_be_bytes(0xC0A1_E5CE_u32.to_be_bytes()),
                )],
            ),
            RfbServerViolation::UnknownEncoding(i32::from_be_bytes(0xC0A1_E5CE_u32.to_be_bytes())),
        ),
        (vec![250, 0, 1, 1], RfbServerViolation::UnknownMessage(250)),
        (vec![4], RfbServerViolation::UnknownMessage(4)),
        (
            update(1, &[zrle]),
            RfbServerViolation::ZrleTooLong(MAX_ZRLE + 1),
        ),
        (fence, RfbServerViolation::FenceTooLong(65)),
    ] {
        let mut f = server(V38, None);
        let mut out = Vec::new();
        f.feed(&greeting(), &mut out).unwrap();
        let before = out.len();
        assert_eq!(f.feed(&message, &mut out), Err(want));
        // What was framed before the fault may have gone; never past it.
        assert!(
            out.len() - before <= 16,
            "{} bytes past",
            out.len() - before
        );
    }
}

#[test]
fn random_bytes_never_carry_a_cut_text_out() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1998);
    for _ in 0..500 {
        let mut s = greeting();
        let n = rng.gen_range(1..2048);
        s.extend((0..n).map(|_| rng.gen::<u8>()));
        let mut f = server(V38, None);
        let mut out = Vec::new();
        let _ = f.feed(&s, &mut out);
        assert!(out.len() <= s.len());
        assert!(f.pending.len() <= 256);
    }
}
