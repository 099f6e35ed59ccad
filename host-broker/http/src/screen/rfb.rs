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
//! For `view` it also rewrites `SetEncodings` to what
//! [`super::rfb_server`] can frame without decompressing
//! ([`VIEW_ENCODINGS`]), and refuses a pixel-format change once updates
//! were asked for, so that the server's answers stay framed and its
//! clipboard can be cut out of them. What it learnt of the connection (the
//! version, the pixel size) it shares through [`Negotiated`].
//!
//! The server-to-client direction of a control connection is not parsed:
//! it goes to the viewer as it is, bounded by the relay.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use dormouse_protocol::screen::ScreenMode;

/// Longest clipboard text accepted from a viewer (1 MiB).
pub const MAX_CUT_TEXT: u32 = 1024 * 1024;
/// Most encodings a `SetEncodings` may list.
pub const MAX_ENCODINGS: u16 = 256;

/// Most screens a `SetDesktopSize` may list.
pub const MAX_SCREENS: u8 = 16;

/// RFB security type None.
const SECURITY_NONE: u8 = 1;

/// The encodings a view connection may ask for, in the viewer's order: what
/// [`super::rfb_server`] frames without decoding. Raw (0), CopyRect (1),
/// Hextile (5, each tile's header gives its length), ZRLE (16,
/// length-prefixed), and the pseudo-encodings DesktopSize (-223),
/// LastRect (-224), Cursor (-239, its size computable), QEMU extended key
/// events (-258, an empty rectangle), DesktopName (-307),
/// ExtendedDesktopSize (-308), fences (-312) and continuous updates
/// (-313). Everything else (Tight, TightPNG, RRE, the extended clipboard,
/// xvp, VMware's cursor, quality levels) is removed from the list.
pub const VIEW_ENCODINGS: [i32; 12] = [0, 1, 5, 16, -223, -224, -239, -258, -307, -308, -312, -313];

/// What the client side of one connection negotiated, shared with the
/// server side's parser. Written by [`RfbFilter`] before it forwards the
/// message that decides it, so the server's answer always finds it set.
#[derive(Debug, Default)]
pub struct Negotiated {
    /// The minor version the viewer chose (3, 7, 8); 0 until then.
    minor: AtomicU8,
    /// Bits per pixel of the viewer's last `SetPixelFormat`; 0 until one.
    bits_per_pixel: AtomicU8,
}

impl Negotiated {
    /// The minor version the viewer chose, once it did.
    pub fn minor(&self) -> Option<u8> {
        Some(self.minor.load(Ordering::Acquire)).filter(|m| *m != 0)
    }

    /// Bits per pixel the viewer asked for, if it sent `SetPixelFormat`.
    pub fn bits_per_pixel(&self) -> Option<u8> {
        Some(self.bits_per_pixel.load(Ordering::Acquire)).filter(|b| *b != 0)
    }
}

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
    /// A view connection's `SetPixelFormat` after it asked for updates: an
    /// update in flight would be framed with the wrong pixel size.
    #[error("pixel format changed after updates were asked for (view)")]
    PixelFormatChange,
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
    /// Whether an update request (or continuous updates) was forwarded.
    updates_asked: bool,
    /// Where, in the output of the current [`Self::feed`], the first
    /// message asking for updates begins (until taken).
    first_ask_at: Option<usize>,
    negotiated: Arc<Negotiated>,
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
            updates_asked: false,
            first_ask_at: None,
            negotiated: Arc::new(Negotiated::default()),
        }
    }

    /// What this connection negotiated, for the server side's parser.
    pub fn negotiated(&self) -> Arc<Negotiated> {
        Arc::clone(&self.negotiated)
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

    /// Where the viewer's first message asking for updates (a
    /// FramebufferUpdateRequest of either kind, or EnableContinuousUpdates)
    /// begins in the output of the [`Self::feed`] call that forwarded it:
    /// the offset into that call's `out`, handed out once, right after it.
    pub fn take_first_ask_offset(&mut self) -> Option<usize> {
        self.first_ask_at.take()
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
                        self.negotiated.minor.store(minor, Ordering::Release);
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
        if forward && self.mode == ScreenMode::View && self.pending.first() == Some(&2) {
            rewrite_encodings(&self.pending, out);
            self.pending.clear();
            return;
        }
        if forward && matches!(self.pending.first(), Some(3 | 150)) {
            if !self.updates_asked {
                self.first_ask_at = Some(out.len());
            }
            self.updates_asked = true;
        }
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
                if !control && self.updates_asked {
                    return Err(RfbViolation::PixelFormatChange);
                }
                self.negotiated.bits_per_pixel.store(bpp, Ordering::Release);
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

/// Appends `SetEncodings` (`message`, whole) with only the encodings of
/// [`VIEW_ENCODINGS`] kept, in the viewer's order; the server falls back to
/// Raw for whatever the viewer asked that is gone.
fn rewrite_encodings(message: &[u8], out: &mut Vec<u8>) {
    let kept: Vec<[u8; 4]> = message
        .get(4..)
        .unwrap_or_default()
        .chunks_exact(4)
        .filter_map(|c| <[u8; 4]>::try_from(c).ok())
        .filter(|c| VIEW_ENCODINGS.contains(&i32::from_be_bytes(*c)))
        .collect();
    // At most the viewer's count (≤ MAX_ENCODINGS), so it fits a u16.
    let count = u16::try_from(kept.len()).unwrap_or(0);
    out.extend_from_slice(&[2, 0]);
    out.extend_from_slice(&count.to_be_bytes());
    for e in kept.iter().take(usize::from(count)) {
        out.extend_from_slice(e);
    }
}

/// The minor version of a well-formed `RFB 003.00x\n` the gateway speaks.
pub(super) fn parse_version(v: &[u8]) -> Result<u8, RfbViolation> {
    match v {
        b"RFB 003.003\n" => Ok(3),
        b"RFB 003.007\n" => Ok(7),
        b"RFB 003.008\n" => Ok(8),
        _ => Err(RfbViolation::BadVersion),
    }
}

#[cfg(test)]
#[path = "rfb_tests.rs"]
mod tests;
