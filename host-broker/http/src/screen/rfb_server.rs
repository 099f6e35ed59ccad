//! The server-to-client RFB filter of a view connection: parses what the
//! desktop's VNC server sends, incrementally over any chunking, and cuts the
//! desktop's clipboard out of it.
//!
//! It owns the grammar of the server side of RFB 3.3/3.7/3.8 (RFC 6143)
//! with security type None: the version, the security types and result
//! (or the failure reason), ServerInit with its name, then
//! FramebufferUpdate, SetColourMapEntries, Bell, ServerCutText,
//! EndOfContinuousUpdates and ServerFence. A FramebufferUpdate is framed,
//! never decoded: Raw and Cursor rectangles by their size in pixels,
//! CopyRect's four bytes, Hextile tile by tile (each tile's header says
//! its length), ZRLE's length prefix, and the empty or small
//! pseudo-rectangles of [`super::rfb::VIEW_ENCODINGS`] (the only
//! encodings [`super::rfb::RfbFilter`] lets a view connection ask for).
//!
//! It must never forward a byte it has not framed, hold more than one
//! message's fixed part (≤ 256 bytes: payloads stream through), or let a
//! ServerCutText (plain or extended) reach the viewer. Anything it cannot
//! frame ends the connection ([`RfbServerViolation`], close code
//! [`dormouse_protocol::screen::CLOSE_DESKTOP_PROTOCOL`]). Control
//! connections are not parsed on this side at all.

use std::sync::Arc;

use super::rfb::{parse_version, Negotiated};

/// Longest server name (ServerInit, DesktopName) it carries.
pub const MAX_NAME: u32 = 64 * 1024;
/// Longest failure reason it carries.
pub const MAX_REASON: u32 = 64 * 1024;
/// Longest ZRLE rectangle it carries (the zlib data of a 4K screen in
/// noise stays well under it).
pub const MAX_ZRLE: u32 = 64 * 1024 * 1024;

/// Why the server side of a view connection is ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RfbServerViolation {
    /// The first 12 bytes are not `RFB 003.00{3,7,8}\n`.
    #[error("bad protocol version")]
    BadVersion,
    /// The server went on past its version before the viewer chose one.
    #[error("the server spoke before the viewer chose a version")]
    SpokeFirst,
    /// A security type or result the gateway does not carry.
    #[error("security {0} refused")]
    BadSecurity(u32),
    /// ServerInit with bits-per-pixel other than 8, 16, 32.
    #[error("pixel format of {0} bits per pixel")]
    BadPixelFormat(u8),
    /// A name or reason over its bound.
    #[error("a string of {0} bytes, at most {MAX_NAME}")]
    StringTooLong(u32),
    /// A message type the gateway does not frame.
    #[error("unknown server message type {0}")]
    UnknownMessage(u8),
    /// A rectangle encoding the gateway does not frame.
    #[error("rectangle encoding {0} is not framed")]
    UnknownEncoding(i32),
    /// A ZRLE rectangle over [`MAX_ZRLE`].
    #[error("zrle rectangle of {0} bytes, at most {MAX_ZRLE}")]
    ZrleTooLong(u32),
    /// A ServerFence payload over 64 bytes.
    #[error("fence payload of {0} bytes, at most 64")]
    FenceTooLong(u8),
    /// Bytes after a failure reason (the server must close).
    #[error("bytes after the failure reason")]
    AfterFailure,
}

/// What comes after a streamed payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// The next message.
    Message,
    /// The next rectangle of an update, this many left (0: the update ends).
    Rect(u16),
    /// The next tile of a Hextile rectangle.
    Tile(Tiles),
    /// Nothing: the server closes.
    Closed,
}

/// Where a Hextile rectangle is: its size, the tile being read, and the
/// rectangles of the update left after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tiles {
    w: u16,
    h: u16,
    index: u32,
    rects_left: u16,
}

impl Tiles {
    fn columns(self) -> u32 {
        u32::from(self.w).div_ceil(16)
    }

    fn count(self) -> u32 {
        self.columns() * u32::from(self.h).div_ceil(16)
    }

    /// The current tile's width and height (16, or less at the edges).
    fn size(self) -> (u64, u64) {
        let (col, row) = (self.index % self.columns(), self.index / self.columns());
        let w = (u32::from(self.w) - col * 16).min(16);
        let h = (u32::from(self.h) - row * 16).min(16);
        (u64::from(w), u64::from(h))
    }

    /// What follows this tile.
    fn next(self) -> After {
        if self.index + 1 >= self.count() {
            After::Rect(self.rects_left)
        } else {
            After::Tile(Tiles {
                index: self.index + 1,
                ..self
            })
        }
    }
}

/// Hextile's subencoding bits.
const HEXTILE_RAW: u8 = 1;
const HEXTILE_BACKGROUND: u8 = 2;
const HEXTILE_FOREGROUND: u8 = 4;
const HEXTILE_SUBRECTS: u8 = 8;
const HEXTILE_COLOURED: u8 = 16;

/// A 4-byte length-like field inside a rectangle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// ZRLE's byte count.
    Zrle,
    /// DesktopName's name length.
    Name,
    /// ExtendedDesktopSize's screen count and padding.
    Screens,
}

/// What the parser expects next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Version,
    /// 3.3: a u32 type; 3.7, 3.8: a count and that many types.
    Security,
    /// 3.8's SecurityResult.
    SecurityResult,
    /// The length of a failure reason.
    FailureLength,
    /// ServerInit's fixed 24 bytes.
    ServerInit,
    Message,
    /// A rectangle header (12 bytes), `left` counting this one.
    Rect {
        left: u16,
    },
    /// A 4-byte field of the rectangle just read.
    Field {
        field: Field,
        left: u16,
    },
    /// A Hextile tile's header: its subencoding, the colours it names, its
    /// subrectangle count.
    Tile(Tiles),
    /// Payload bytes to pass (forward or drop).
    Stream {
        left: u64,
        forward: bool,
        then: After,
    },
    Closed,
}

/// An incremental RFB server-to-client filter for one view connection.
#[derive(Debug)]
pub struct RfbServerFilter {
    stage: Stage,
    /// The current fixed part (at most 256 bytes).
    pending: Vec<u8>,
    negotiated: Arc<Negotiated>,
    /// The server's own version's minor.
    server_minor: u8,
    /// Bits per pixel of ServerInit, until the viewer sets its own.
    init_bits_per_pixel: u8,
    dropped_cut_text: u64,
    updates: u64,
}

impl RfbServerFilter {
    /// A filter at the start of a connection whose client side
    /// [`super::rfb::RfbFilter`] shares `negotiated`.
    pub fn new(negotiated: Arc<Negotiated>) -> Self {
        Self {
            stage: Stage::Version,
            pending: Vec::with_capacity(64),
            negotiated,
            server_minor: 0,
            init_bits_per_pixel: 0,
            dropped_cut_text: 0,
            updates: 0,
        }
    }

    /// ServerCutText messages dropped so far.
    pub fn dropped_cut_text(&self) -> u64 {
        self.dropped_cut_text
    }

    /// FramebufferUpdate messages framed so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Parses `input` and appends what may reach the viewer to `out`. After
    /// an error the connection must be closed.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), RfbServerViolation> {
        while !input.is_empty() {
            if let Stage::Stream {
                left,
                forward,
                then,
            } = self.stage
            {
                let take = input.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                if forward {
                    out.extend_from_slice(&input[..take]);
                }
                input = &input[take..];
                let left = left - u64::try_from(take).unwrap_or(left);
                self.stage = self.stream(left, forward, then);
                continue;
            }
            if self.stage == Stage::Closed {
                return Err(RfbServerViolation::AfterFailure);
            }
            let want = self.want()?;
            let take = want.saturating_sub(self.pending.len()).min(input.len());
            self.pending.extend_from_slice(&input[..take]);
            input = &input[take..];
            // The fixed part may grow once its count arrives (a fence's
            // length, the number of security types): whole only when what
            // it holds says so.
            if self.pending.len() == self.want()? {
                self.complete(out)?;
            }
        }
        Ok(())
    }

    fn after(&self, then: After) -> Stage {
        match then {
            After::Message | After::Rect(0) => Stage::Message,
            After::Rect(left) => Stage::Rect { left },
            After::Tile(tiles) => Stage::Tile(tiles),
            After::Closed => Stage::Closed,
        }
    }

    /// The minor version both sides speak; the server's answer to the
    /// viewer's choice never comes before it, so an unknown choice means
    /// the server is not speaking RFB.
    fn minor(&self) -> Result<u8, RfbServerViolation> {
        let client = self
            .negotiated
            .minor()
            .ok_or(RfbServerViolation::SpokeFirst)?;
        Ok(client.min(self.server_minor))
    }

    /// Bytes per pixel of the updates now.
    fn bytes_per_pixel(&self) -> u64 {
        let bits = self
            .negotiated
            .bits_per_pixel()
            .unwrap_or(self.init_bits_per_pixel);
        u64::from(bits / 8)
    }

    /// How many bytes the current fixed part has, given what `pending` holds.
    fn want(&self) -> Result<usize, RfbServerViolation> {
        let p = &self.pending;
        Ok(match self.stage {
            Stage::Version => 12,
            Stage::Security => match self.minor()? {
                3 => 4,
                _ => p.first().map_or(1, |n| 1 + usize::from(*n)),
            },
            Stage::SecurityResult | Stage::FailureLength | Stage::Field { .. } => 4,
            Stage::ServerInit => 24,
            Stage::Rect { .. } => 12,
            Stage::Tile(_) => match p.first() {
                None => 1,
                Some(se) if se & HEXTILE_RAW != 0 => 1,
                Some(&se) => {
                    let bpp = usize::try_from(self.bytes_per_pixel()).unwrap_or(4);
                    let colour = |bit: u8| if se & bit != 0 { bpp } else { 0 };
                    1 + colour(HEXTILE_BACKGROUND)
                        + colour(HEXTILE_FOREGROUND)
                        + usize::from(se & HEXTILE_SUBRECTS != 0)
                }
            },
            Stage::Message => match p.first() {
                None => 1,
                Some(0) => 4,
                Some(1) => 6,
                Some(2 | 150) => 1,
                Some(3) => 8,
                Some(248) => match p.get(8) {
                    None => 9,
                    Some(&n) if n > 64 => return Err(RfbServerViolation::FenceTooLong(n)),
                    Some(&n) => 9 + usize::from(n),
                },
                Some(&other) => return Err(RfbServerViolation::UnknownMessage(other)),
            },
            Stage::Stream { .. } | Stage::Closed => 0,
        })
    }

    /// Handles a whole fixed part: forwards it (or not) and moves on.
    fn complete(&mut self, out: &mut Vec<u8>) -> Result<(), RfbServerViolation> {
        let p = std::mem::take(&mut self.pending);
        let u32_at = |at: usize| u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]);
        let u16_at = |at: usize| u16::from_be_bytes([p[at], p[at + 1]]);
        let mut forward = true;
        self.stage = match self.stage {
            Stage::Version => {
                self.server_minor =
                    parse_version(&p).map_err(|_| RfbServerViolation::BadVersion)?;
                Stage::Security
            }
            Stage::Security => match self.minor()? {
                3 => match u32_at(0) {
                    0 => Stage::FailureLength,
                    1 => Stage::ServerInit,
                    other => return Err(RfbServerViolation::BadSecurity(other)),
                },
                // No type offered: a reason follows. Otherwise the viewer
                // picks None (its filter allows nothing else).
                _ if p[0] == 0 => Stage::FailureLength,
                8 => Stage::SecurityResult,
                _ => Stage::ServerInit,
            },
            Stage::SecurityResult => match u32_at(0) {
                0 => Stage::ServerInit,
                1 => Stage::FailureLength,
                other => return Err(RfbServerViolation::BadSecurity(other)),
            },
            Stage::FailureLength => self.stream(
                u64::from(bounded(u32_at(0), MAX_REASON)?),
                true,
                After::Closed,
            ),
            Stage::ServerInit => {
                let bits = p[4];
                if !matches!(bits, 8 | 16 | 32) {
                    return Err(RfbServerViolation::BadPixelFormat(bits));
                }
                self.init_bits_per_pixel = bits;
                self.stream(
                    u64::from(bounded(u32_at(20), MAX_NAME)?),
                    true,
                    After::Message,
                )
            }
            Stage::Message => match p[0] {
                0 => {
                    self.updates += 1;
                    self.after(After::Rect(u16_at(2)))
                }
                1 => self.stream(6 * u64::from(u16_at(4)), true, After::Message),
                3 => {
                    // Dropped whole, header and text, in either form (a
                    // negative length is the extended clipboard's).
                    forward = false;
                    self.dropped_cut_text += 1;
                    let len = i32::from_be_bytes([p[4], p[5], p[6], p[7]]).unsigned_abs();
                    self.stream(u64::from(len), false, After::Message)
                }
                _ => Stage::Message,
            },
            Stage::Rect { left } => {
                let left = left - 1;
                let (w, h) = (u64::from(u16_at(4)), u64::from(u16_at(6)));
                let encoding = i32::from_be_bytes([p[8], p[9], p[10], p[11]]);
                let bpp = self.bytes_per_pixel();
                match encoding {
                    0 => self.stream(w * h * bpp, true, After::Rect(left)),
                    1 => self.stream(4, true, After::Rect(left)),
                    5 => {
                        let tiles = Tiles {
                            w: u16_at(4),
                            h: u16_at(6),
                            index: 0,
                            rects_left: left,
                        };
                        if tiles.count() == 0 {
                            self.after(After::Rect(left))
                        } else {
                            Stage::Tile(tiles)
                        }
                    }
                    16 => Stage::Field {
                        field: Field::Zrle,
                        left,
                    },
                    // DesktopSize and QEMU's key-event acknowledgement:
                    // the header is all.
                    -223 | -258 => self.after(After::Rect(left)),
                    // LastRect ends the update whatever the count said.
                    -224 => Stage::Message,
                    -239 => self.stream(w * h * bpp + w.div_ceil(8) * h, true, After::Rect(left)),
                    -307 => Stage::Field {
                        field: Field::Name,
                        left,
                    },
                    -308 => Stage::Field {
                        field: Field::Screens,
                        left,
                    },
                    other => return Err(RfbServerViolation::UnknownEncoding(other)),
                }
            }
            Stage::Tile(tiles) => {
                let se = p[0];
                let bpp = self.bytes_per_pixel();
                let (w, h) = tiles.size();
                if se & HEXTILE_RAW != 0 {
                    self.stream(w * h * bpp, true, tiles.next())
                } else if se & HEXTILE_SUBRECTS != 0 {
                    let count = u64::from(p[p.len() - 1]);
                    let each = 2 + if se & HEXTILE_COLOURED != 0 { bpp } else { 0 };
                    self.stream(count * each, true, tiles.next())
                } else {
                    self.after(tiles.next())
                }
            }
            Stage::Field { field, left } => {
                let value = u32_at(0);
                let len = match field {
                    Field::Zrle if value > MAX_ZRLE => {
                        return Err(RfbServerViolation::ZrleTooLong(value))
                    }
                    Field::Zrle => u64::from(value),
                    Field::Name => u64::from(bounded(value, MAX_NAME)?),
                    Field::Screens => 16 * u64::from(p[0]),
                };
                self.stream(len, true, After::Rect(left))
            }
            Stage::Stream { .. } | Stage::Closed => self.stage,
        };
        if forward {
            out.extend_from_slice(&p);
        }
        // Keep the buffer's allocation (it never grows past 256 bytes).
        self.pending = p;
        self.pending.clear();
        Ok(())
    }

    /// A stream of `left` bytes, or straight to what follows if empty.
    fn stream(&self, left: u64, forward: bool, then: After) -> Stage {
        if left == 0 {
            self.after(then)
        } else {
            Stage::Stream {
                left,
                forward,
                then,
            }
        }
    }
}

fn bounded(len: u32, max: u32) -> Result<u32, RfbServerViolation> {
    if len > max {
        Err(RfbServerViolation::StringTooLong(len))
    } else {
        Ok(len)
    }
}

#[cfg(test)]
#[path = "rfb_server_tests.rs"]
mod tests;
