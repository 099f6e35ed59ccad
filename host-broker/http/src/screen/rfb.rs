//! The client-to-server RFB filter: parses what a viewer sends, incrementally
//! over any chunking, and decides what reaches the desktop's VNC server.
//!
//! It owns the grammar of the client side of RFB 3.3/3.7/3.8 (RFC 6143) with
//! security type None, plus the extensions noVNC sends (continuous updates,
//! fences, desktop size, xvp, QEMU extended key events, QEMU audio). It must
//! never forward a byte it has not parsed, keep more than one bounded message
//! in memory, or let a view capability's input through: for `view`, key,
//! pointer, clipboard, desktop-size, xvp and QEMU key messages are dropped
//! (not forwarded, the connection stays up; see docs/screens.md for why).
//! Anything it does not understand ends the connection.
//!
//! The server-to-client direction is not parsed: it comes from the guest's
//! VNC server and goes to the viewer as it is, bounded by the relay.

use dormouse_protocol::screen::ScreenMode;

/// Longest clipboard text accepted from a viewer (1 MiB).
pub const MAX_CUT_TEXT: u32 = 1024 * 1024;
/// Most encodings a `SetEncodings` may list.
pub const MAX_ENCODINGS: u16 = 256;

/// Most screens a `SetDesktopSize` may list.
pub const MAX_SCREENS: u8 = 16;

/// RFB security type None.
const SECURITY_NONE: u8 = 1;

/// Why the filter ends a connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RfbViolation {
    /// The first 12 bytes are not `RFB 003.00{3,7,8}\n`.
    #[error("bad protocol version")]
    BadVersion,
    /// A security type other than None.
    #[error("security type {0} refused (only None)")]
    BadSecurity(u8),
    /// A message type the gateway does not know.
    #[error("unknown message type {0}")]
    UnknownMessage(u8),
    /// An unknown QEMU sub-message or audio operation.
    #[error("unknown qemu message {0}")]
    UnknownQemu(u16),
    /// `SetEncodings` with more than [`MAX_ENCODINGS`].
    #[error("{0} encodings, at most {MAX_ENCODINGS}")]
    TooManyEncodings(u16),
    /// `ClientCutText` longer than [`MAX_CUT_TEXT`].
    #[error("clipboard text of {0} bytes, at most {MAX_CUT_TEXT}")]
    CutTextTooLong(u32),
    /// `SetPixelFormat` with bits-per-pixel other than 8, 16, 32.
    #[error("pixel format of {0} bits per pixel")]
    BadPixelFormat(u8),
    /// `SetDesktopSize` with more than [`MAX_SCREENS`].
    #[error("{0} screens, at most {MAX_SCREENS}")]
    TooManyScreens(u8),
    /// A `ClientFence` payload over 64 bytes.
    #[error("fence payload of {0} bytes, at most 64")]
    FenceTooLong(u8),
}

/// What the parser expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// 12 bytes of ProtocolVersion.
    Version,
    /// 1 byte: the security type the client picked (3.7 and 3.8 only).
    Security,
    /// 1 byte: ClientInit's shared flag.
    ClientInit,
    /// A message's fixed part, `need` bytes in total (type byte included).
    Message,
    /// The text of a ClientCutText still to pass (forward or drop).
    CutText { left: u32, forward: bool },
}

/// An incremental RFB client-to-server filter for one connection.
#[derive(Debug)]
pub struct RfbFilter {
    mode: ScreenMode,
    stage: Stage,
    /// The bytes of the current fixed part seen so far (at most
    /// `4 + 4 * MAX_ENCODINGS`).
    pending: Vec<u8>,
    dropped: u64,
    /// The viewer's first whole-screen update request.
    first_full_request: FirstFullRequest,
}

/// Where the viewer's first non-incremental FramebufferUpdateRequest is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstFullRequest {
    NotSeen,
    Forwarded([u8; 10]),
    HandedOut,
}

/// Outcome of parsing `pending` as a message header.
enum Parsed {
    /// More bytes are needed before the length is known or reached.
    NeedMore,
    /// A whole fixed-size message: forward it or not.
    Whole { forward: bool },
    /// ClientCutText's 8-byte header; `len` bytes of text follow.
    CutText { len: u32, forward: bool },
}

impl RfbFilter {
    /// A filter at the start of a connection.
    pub fn new(mode: ScreenMode) -> Self {
        Self {
            mode,
            stage: Stage::Version,
            pending: Vec::with_capacity(64),
            dropped: 0,
            first_full_request: FirstFullRequest::NotSeen,
        }
    }

    /// The viewer's first non-incremental FramebufferUpdateRequest, once it
    /// has been forwarded; handed out once.
    pub fn take_first_full_request(&mut self) -> Option<[u8; 10]> {
        match self.first_full_request {
            FirstFullRequest::Forwarded(request) => {
                self.first_full_request = FirstFullRequest::HandedOut;
                Some(request)
            }
            FirstFullRequest::NotSeen | FirstFullRequest::HandedOut => None,
        }
    }

    /// Whether the next byte forwarded starts a message, so that a message
    /// of the gateway's own may go to the server between two of the
    /// viewer's.
    pub fn at_message_boundary(&self) -> bool {
        matches!(self.stage, Stage::Message) && self.pending.is_empty()
    }

    /// Input messages dropped so far (view mode).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether the handshake is behind us (messages are being parsed).
    pub fn in_messages(&self) -> bool {
        matches!(self.stage, Stage::Message | Stage::CutText { .. })
    }

    /// Parses `input` and appends what may reach the server to `out`. After
    /// an error the connection must be closed; the filter is not reusable.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), RfbViolation> {
        while !input.is_empty() {
            match self.stage {
                Stage::CutText { left, forward } => {
                    let take = input.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    if forward {
                        out.extend_from_slice(&input[..take]);
                    }
                    input = &input[take..];
                    let left = left - u32::try_from(take).unwrap_or(left);
                    self.stage = if left == 0 {
                        Stage::Message
                    } else {
                        Stage::CutText { left, forward }
                    };
                }
                Stage::Version => {
                    input = self.fill(input, 12);
                    if self.pending.len() == 12 {
                        let minor = parse_version(&self.pending)?;
                        out.extend_from_slice(&self.pending);
                        self.pending.clear();
                        self.stage = if minor == 3 {
                            // 3.3: the server decides the security type and
                            // the client answers nothing (None).
                            Stage::ClientInit
                        } else {
                            Stage::Security
                        };
                    }
                }
                Stage::Security => {
                    let kind = input[0];
                    input = &input[1..];
                    if kind != SECURITY_NONE {
                        return Err(RfbViolation::BadSecurity(kind));
                    }
                    out.push(kind);
                    self.stage = Stage::ClientInit;
                }
                Stage::ClientInit => {
                    input = &input[1..];
                    // Always shared: an exclusive ClientInit would make the
                    // server drop every other viewer of this desktop.
                    out.push(1);
                    self.stage = Stage::Message;
                }
                Stage::Message => {
                    // Take bytes one header step at a time: at most what the
                    // message needs, so `pending` never holds two messages.
                    let want = self.header_len()?;
                    input = self.fill(input, want);
                    match self.parse()? {
                        Parsed::NeedMore => {}
                        Parsed::Whole { forward } => {
                            self.pass(forward, out);
                        }
                        Parsed::CutText { len, forward } => {
                            self.pass(forward, out);
                            if len > 0 {
                                self.stage = Stage::CutText { left: len, forward };
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves up to `want - pending.len()` bytes of `input` into `pending`.
    fn fill<'a>(&mut self, input: &'a [u8], want: usize) -> &'a [u8] {
        let take = want.saturating_sub(self.pending.len()).min(input.len());
        self.pending.extend_from_slice(&input[..take]);
        &input[take..]
    }

    fn pass(&mut self, forward: bool, out: &mut Vec<u8>) {
        if forward {
            if self.first_full_request == FirstFullRequest::NotSeen {
                if let Ok(request) = <[u8; 10]>::try_from(self.pending.as_slice()) {
                    if request[0] == 3 && request[1] == 0 {
                        self.first_full_request = FirstFullRequest::Forwarded(request);
                    }
                }
            }
            out.extend_from_slice(&self.pending);
        } else {
            self.dropped += 1;
        }
        self.pending.clear();
    }

    /// How many bytes of the current message are known to be needed, given
    /// what `pending` holds (grows as length fields arrive).
    fn header_len(&self) -> Result<usize, RfbViolation> {
        let p = &self.pending;
        let Some(&kind) = p.first() else {
            return Ok(1);
        };
        Ok(match kind {
            0 => 20,
            2 => {
                if p.len() < 4 {
                    4
                } else {
                    let count = u16::from_be_bytes([p[2], p[3]]);
                    if count > MAX_ENCODINGS {
                        return Err(RfbViolation::TooManyEncodings(count));
                    }
                    4 + 4 * usize::from(count)
                }
            }
            3 | 150 => 10,
            4 => 8,
            5 => 6,
            6 => 8,
            248 => {
                if p.len() < 9 {
                    9
                } else if p[8] > 64 {
                    return Err(RfbViolation::FenceTooLong(p[8]));
                } else {
                    9 + usize::from(p[8])
                }
            }
            251 => {
                if p.len() < 8 {
                    8
                } else if p[6] > MAX_SCREENS {
                    return Err(RfbViolation::TooManyScreens(p[6]));
                } else {
                    8 + 16 * usize::from(p[6])
                }
            }
            // xvp: type, padding, extension version, message code.
            250 => 4,
            255 => {
                if p.len() < 2 {
                    2
                } else {
                    match p[1] {
                        0 => 12,
                        1 => {
                            if p.len() < 4 {
                                4
                            } else {
                                match u16::from_be_bytes([p[2], p[3]]) {
                                    0 | 1 => 4,
                                    2 => 10,
                                    op => return Err(RfbViolation::UnknownQemu(op)),
                                }
                            }
                        }
                        sub => return Err(RfbViolation::UnknownQemu(u16::from(sub))),
                    }
                }
            }
            other => return Err(RfbViolation::UnknownMessage(other)),
        })
    }

    fn parse(&self) -> Result<Parsed, RfbViolation> {
        let need = self.header_len()?;
        let p = &self.pending;
        if p.len() < need {
            return Ok(Parsed::NeedMore);
        }
        let control = self.mode == ScreenMode::Control;
        Ok(match p[0] {
            0 => {
                let bpp = p[4];
                if !matches!(bpp, 8 | 16 | 32) {
                    return Err(RfbViolation::BadPixelFormat(bpp));
                }
                Parsed::Whole { forward: true }
            }
            2 | 3 | 150 => Parsed::Whole { forward: true },
            248 => Parsed::Whole { forward: true },
            // Input, desktop resizing and power (xvp, 250): control only.
            4 | 5 | 250 | 251 => Parsed::Whole { forward: control },
            6 => {
                // A negative length is the extended-clipboard form; its size
                // is the absolute value either way.
                let raw = i32::from_be_bytes([p[4], p[5], p[6], p[7]]);
                let len = raw.unsigned_abs();
                if len > MAX_CUT_TEXT {
                    return Err(RfbViolation::CutTextTooLong(len));
                }
                Parsed::CutText {
                    len,
                    forward: control,
                }
            }
            // QEMU: extended key events are input; audio control is not.
            255 => Parsed::Whole {
                forward: p[1] != 0 || control,
            },
            other => return Err(RfbViolation::UnknownMessage(other)),
        })
    }
}

/// The minor version of a well-formed `RFB 003.00x\n` the gateway speaks.
fn parse_version(v: &[u8]) -> Result<u8, RfbViolation> {
    match v {
        b"RFB 003.003\n" => Ok(3),
        b"RFB 003.007\n" => Ok(7),
        b"RFB 003.008\n" => Ok(8),
        _ => Err(RfbViolation::BadVersion),
    }
}

#[cfg(test)]
mod tests {
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
            view.extend_from_slice(h);
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
}
