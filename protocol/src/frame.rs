//! Framing on the guest socket: a fixed 8-byte header, a JSON message and an
//! optional binary payload (screenshots).
//!
//! ```text
//! +----------------+-----------------+--------------------+-----------------+
//! | json_len u32BE | payload_len u32BE | json (json_len)  | payload (bytes) |
//! +----------------+-----------------+--------------------+-----------------+
//! ```
//!
//! The JSON is an object with `"v"` (the sender's [`PROTOCOL_VERSION`]) and
//! `"kind"` beside the message's own fields. Both lengths are checked against
//! named maxima *before* anything is allocated, so a hostile peer cannot make
//! the reader allocate or wait for more than one bounded frame. Every failure
//! is a [`FrameError`], never a panic.

use std::io::{Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::PROTOCOL_VERSION;

/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 8;
/// Largest JSON part of a frame. Status objects are a few KiB.
pub const MAX_HEADER_LEN: u32 = 256 * 1024;
/// Largest binary payload of a frame: a PNG of a large screen fits easily.
pub const MAX_PAYLOAD_LEN: u32 = 32 * 1024 * 1024;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the stream cleanly between frames.
    #[error("connection closed")]
    Closed,
    /// The stream ended inside a frame.
    #[error("truncated frame: expected {expected} bytes, got {got}")]
    Truncated {
        /// Bytes the frame announced.
        expected: usize,
        /// Bytes that arrived.
        got: usize,
    },
    /// The JSON part is larger than [`MAX_HEADER_LEN`].
    #[error("frame message of {len} bytes exceeds the limit of {max}")]
    MessageTooLarge {
        /// Announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The payload is larger than [`MAX_PAYLOAD_LEN`].
    #[error("frame payload of {len} bytes exceeds the limit of {max}")]
    PayloadTooLarge {
        /// Announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The JSON part is empty.
    #[error("frame has an empty message")]
    EmptyMessage,
    /// The JSON is not an object with a numeric `v` and a string `kind`.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// The peer speaks a newer protocol than this side understands.
    #[error("peer speaks protocol version {peer}, this side understands up to {supported}")]
    UnsupportedVersion {
        /// The peer's version.
        peer: u64,
        /// Ours.
        supported: u32,
    },
    /// The `kind` is not one this version knows.
    #[error("unknown message kind {0:?}")]
    UnknownKind(String),
    /// Reading or writing the stream failed.
    #[error("i/o on the socket: {0}")]
    Io(#[from] std::io::Error),
}

/// A message type that can travel in a frame.
pub trait Message: Serialize + DeserializeOwned {
    /// Every `kind` tag the type understands.
    const KINDS: &'static [&'static str];
    /// Whether this message may come with a binary payload; a reader refuses
    /// a payload on any other before reading it.
    fn payload_allowed(&self) -> bool;
    /// This message's `kind` tag.
    fn kind(&self) -> &'static str;
}

/// The validated fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Length of the JSON part.
    pub message_len: u32,
    /// Length of the binary payload.
    pub payload_len: u32,
}

impl FrameHeader {
    /// Parses and bounds-checks the 8 header bytes.
    pub fn parse(bytes: [u8; HEADER_LEN]) -> Result<Self, FrameError> {
        let message_len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let payload_len = u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        let header = Self {
            message_len,
            payload_len,
        };
        header.check()?;
        Ok(header)
    }

    fn check(&self) -> Result<(), FrameError> {
        if self.message_len == 0 {
            return Err(FrameError::EmptyMessage);
        }
        if self.message_len > MAX_HEADER_LEN {
            return Err(FrameError::MessageTooLarge {
                len: self.message_len,
                max: MAX_HEADER_LEN,
            });
        }
        if self.payload_len > MAX_PAYLOAD_LEN {
            return Err(FrameError::PayloadTooLarge {
                len: self.payload_len,
                max: MAX_PAYLOAD_LEN,
            });
        }
        Ok(())
    }

    /// The 8 header bytes.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..4].copy_from_slice(&self.message_len.to_be_bytes());
        out[4..].copy_from_slice(&self.payload_len.to_be_bytes());
        out
    }
}

/// Encodes a message and payload into one frame.
pub fn encode<M: Message>(message: &M, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
    let mut out = encode_head(message, payload.len())?;
    out.extend_from_slice(payload);
    Ok(out)
}

/// Encodes the header and message of a frame whose `payload_len` bytes of
/// payload the caller writes right after, so a large payload (a screenshot)
/// is never copied into one buffer with the message. Both lengths are
/// checked against the protocol's limits.
pub fn encode_head<M: Message>(message: &M, payload_len: usize) -> Result<Vec<u8>, FrameError> {
    let mut value =
        serde_json::to_value(message).map_err(|e| FrameError::Malformed(e.to_string()))?;
    let object = value
        .as_object_mut()
        .ok_or_else(|| FrameError::Malformed("message is not a JSON object".into()))?;
    object.insert("v".into(), PROTOCOL_VERSION.into());
    let json = serde_json::to_vec(&value).map_err(|e| FrameError::Malformed(e.to_string()))?;
    head(&json, payload_len).check()?;
    Ok(head_bytes(&json, payload_len))
}

/// Frames bytes as they stand, without checking lengths or content. Tests
/// and tools use it to play a hostile or broken peer (garbage JSON, unknown
/// kinds, newer versions, unexpected payloads).
pub fn frame_unchecked(json: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = head_bytes(json, payload.len());
    out.extend_from_slice(payload);
    out
}

fn head(json: &[u8], payload_len: usize) -> FrameHeader {
    FrameHeader {
        message_len: u32::try_from(json.len()).unwrap_or(u32::MAX),
        payload_len: u32::try_from(payload_len).unwrap_or(u32::MAX),
    }
}

/// The one place the wire layout is written: header, then message.
fn head_bytes(json: &[u8], payload_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + json.len());
    out.extend_from_slice(&head(json, payload_len).to_bytes());
    out.extend_from_slice(json);
    out
}

/// Bounds a receiver puts on the text a hostile peer sends: every string of
/// a message is escaped ([`escape_text`]) and cut to `max_bytes`, every list
/// cut to `max_items`, before the message is typed. The shape (and thus the
/// meaning of every field) stays; only its size and its control characters
/// go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taming {
    /// Longest string kept, in UTF-8 bytes after escaping.
    pub max_bytes: usize,
    /// Most items kept of any list.
    pub max_items: usize,
}

impl Taming {
    /// What the broker keeps of a guest's messages: 300 bytes per string,
    /// 32 items per list (a status has 4–5 services and about 25 checks).
    /// A status so tamed holds at most 131 strings (identity, problem,
    /// schema version, 2 per service, 2 per check): about 40 KB of text
    /// and 5 KB of structure, whatever the guest sends.
    pub const GUEST: Taming = Taming {
        max_bytes: 300,
        max_items: 32,
    };
}

/// Whether `c` could steer a terminal or forge a log line: a control
/// character, or a Unicode format character that reorders or hides text
/// (bidi embeddings, overrides and isolates, zero-width characters, the
/// byte-order mark).
pub fn is_hazardous(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
        )
}

/// `text` with every [`is_hazardous`] character written as its Rust escape
/// (`\u{1b}`, `\n`), cut to at most `max_bytes` bytes (at a character
/// boundary, never inside an escape).
pub fn escape_text(text: &str, max_bytes: usize) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if is_hazardous(c) {
            let escaped: String = c.escape_default().collect();
            if out.len() + escaped.len() > max_bytes {
                break;
            }
            out.push_str(&escaped);
        } else {
            if out.len() + c.len_utf8() > max_bytes {
                break;
            }
            out.push(c);
        }
    }
    out
}

/// Applies `taming` to every string and list in `value`.
pub fn tame(value: &mut serde_json::Value, taming: &Taming) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            if s.len() > taming.max_bytes || s.chars().any(is_hazardous) {
                *s = escape_text(s, taming.max_bytes);
            }
        }
        Value::Array(items) => {
            items.truncate(taming.max_items);
            for item in items {
                tame(item, taming);
            }
        }
        // Keys stay: typed messages have fixed field names, and serde drops
        // the keys it does not know.
        Value::Object(map) => {
            for v in map.values_mut() {
                tame(v, taming);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Decodes the JSON part of a frame: checks `v` and `kind`, then the fields.
pub fn decode_message<M: Message>(json: &[u8]) -> Result<M, FrameError> {
    decode_message_tamed(json, None)
}

/// [`decode_message`], with every string and list of the message bounded
/// by `taming` (when given) before it is typed.
pub fn decode_message_tamed<M: Message>(
    json: &[u8],
    taming: Option<&Taming>,
) -> Result<M, FrameError> {
    let mut value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| FrameError::Malformed(e.to_string()))?;
    let object = value
        .as_object_mut()
        .ok_or_else(|| FrameError::Malformed("message is not a JSON object".into()))?;
    let version = object
        .remove("v")
        .ok_or_else(|| FrameError::Malformed("missing protocol version \"v\"".into()))?
        .as_u64()
        .ok_or_else(|| FrameError::Malformed("\"v\" is not a non-negative integer".into()))?;
    if version > u64::from(PROTOCOL_VERSION) {
        return Err(FrameError::UnsupportedVersion {
            peer: version,
            supported: PROTOCOL_VERSION,
        });
    }
    let kind = object
        .get("kind")
        .and_then(|k| k.as_str())
        .ok_or_else(|| FrameError::Malformed("missing string \"kind\"".into()))?;
    if !M::KINDS.contains(&kind) {
        return Err(FrameError::UnknownKind(escape_text(kind, 64)));
    }
    if let Some(taming) = taming {
        tame(&mut value, taming);
    }
    serde_json::from_value(value).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame<M> {
    /// The message.
    pub message: M,
    /// The binary payload (empty for most messages).
    pub payload: Vec<u8>,
}

/// Decodes one whole frame from a buffer. Returns `Ok(None)` when the buffer
/// holds less than one frame, else the frame and the bytes it used.
pub fn decode<M: Message>(buf: &[u8]) -> Result<Option<(Frame<M>, usize)>, FrameError> {
    let Some(head) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let mut bytes = [0u8; HEADER_LEN];
    bytes.copy_from_slice(head);
    let header = FrameHeader::parse(bytes)?;
    let json_end = HEADER_LEN + header.message_len as usize;
    let end = json_end + header.payload_len as usize;
    if buf.len() < end {
        return Ok(None);
    }
    let message = decode_message(&buf[HEADER_LEN..json_end])?;
    Ok(Some((
        Frame {
            message,
            payload: buf[json_end..end].to_vec(),
        },
        end,
    )))
}

/// Writes one frame to a blocking stream.
pub fn write_frame<M: Message>(
    w: &mut impl Write,
    message: &M,
    payload: &[u8],
) -> Result<(), FrameError> {
    w.write_all(&encode(message, payload)?)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame from a blocking stream. A clean end of stream before the
/// first byte is [`FrameError::Closed`]; inside a frame it is
/// [`FrameError::Truncated`].
pub fn read_frame<M: Message>(r: &mut impl Read) -> Result<Frame<M>, FrameError> {
    let mut head = [0u8; HEADER_LEN];
    let got = read_full(r, &mut head)?;
    if got == 0 {
        return Err(FrameError::Closed);
    }
    if got < HEADER_LEN {
        return Err(FrameError::Truncated {
            expected: HEADER_LEN,
            got,
        });
    }
    let header = FrameHeader::parse(head)?;
    let mut json = vec![0u8; header.message_len as usize];
    let got = read_full(r, &mut json)?;
    if got < json.len() {
        return Err(FrameError::Truncated {
            expected: json.len(),
            got,
        });
    }
    let mut payload = vec![0u8; header.payload_len as usize];
    let got = read_full(r, &mut payload)?;
    if got < payload.len() {
        return Err(FrameError::Truncated {
            expected: payload.len(),
            got,
        });
    }
    Ok(Frame {
        message: decode_message(&json)?,
        payload,
    })
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::{ContainerStartIdentity, Hello, Request, Response};

    fn hello() -> Response {
        Response::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            supervisor_version: "0.1.0".into(),
            identity: ContainerStartIdentity {
                boot_id: "b".into(),
                pid_ns_inode: 4026531836,
                pid1_start_time: 42,
            },
        })
    }

    fn raw(json: &str, payload: &[u8]) -> Vec<u8> {
        frame_unchecked(json.as_bytes(), payload)
    }

    #[test]
    fn requests_round_trip() {
        for request in [
            Request::Hello,
            Request::Status,
            Request::Watch,
            Request::Screenshot {
                encoding: crate::image::ImageEncoding::default(),
            },
            Request::Screenshot {
                encoding: crate::image::ImageEncoding {
                    format: crate::image::ImageFormat::Jpeg,
                    quality: Some(30),
                },
            },
            Request::Quiesce { timeout_ms: 5000 },
            Request::Activity,
        ] {
            let bytes = encode(&request, &[]).expect("encode");
            let (frame, used) = decode::<Request>(&bytes).expect("decode").expect("whole");
            assert_eq!(frame.message, request);
            assert_eq!(used, bytes.len());
        }
    }

    #[test]
    fn response_with_payload_round_trips_through_a_stream() {
        let png = vec![0x89, b'P', b'N', b'G', 1, 2, 3];
        let mut wire = Vec::new();
        write_frame(
            &mut wire,
            &Response::Screenshot {
                width: 2,
                height: 1,
                format: crate::image::ImageFormat::Png,
            },
            &png,
        )
        .expect("write");
        write_frame(&mut wire, &hello(), &[]).expect("write");
        let mut cursor = std::io::Cursor::new(wire);
        let first: Frame<Response> = read_frame(&mut cursor).expect("first");
        assert_eq!(first.payload, png);
        let second: Frame<Response> = read_frame(&mut cursor).expect("second");
        assert_eq!(second.message, hello());
        assert!(matches!(
            read_frame::<Response>(&mut cursor),
            Err(FrameError::Closed)
        ));
    }

    #[test]
    fn wire_form_carries_version_and_kind() {
        let bytes = encode(&Request::Quiesce { timeout_ms: 7 }, &[]).expect("encode");
        let json: serde_json::Value = serde_json::from_slice(&bytes[HEADER_LEN..]).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"v": 1, "kind": "quiesce", "timeout_ms": 7})
        );
    }

    #[test]
    fn truncated_frames_are_reported() {
        let bytes = encode(&hello(), &[1, 2, 3]).expect("encode");
        for cut in 1..bytes.len() {
            let mut cursor = std::io::Cursor::new(&bytes[..cut]);
            let err = read_frame::<Response>(&mut cursor).expect_err("must fail");
            assert!(
                matches!(err, FrameError::Truncated { .. }),
                "cut {cut}: {err}"
            );
            assert!(decode::<Response>(&bytes[..cut])
                .expect("partial")
                .is_none());
        }
    }

    #[test]
    fn oversized_lengths_are_refused_before_reading() {
        let huge = FrameHeader {
            message_len: MAX_HEADER_LEN + 1,
            payload_len: 0,
        }
        .to_bytes();
        assert!(matches!(
            FrameHeader::parse(huge),
            Err(FrameError::MessageTooLarge { .. })
        ));
        let huge_payload = FrameHeader {
            message_len: 2,
            payload_len: u32::MAX,
        }
        .to_bytes();
        let mut cursor = std::io::Cursor::new(huge_payload.to_vec());
        assert!(matches!(
            read_frame::<Request>(&mut cursor),
            Err(FrameError::PayloadTooLarge { .. })
        ));
        let big = vec![0u8; MAX_PAYLOAD_LEN as usize + 1];
        assert!(matches!(
            encode(
                &Response::Screenshot {
                    width: 1,
                    height: 1,
                    format: crate::image::ImageFormat::Png,
                },
                &big
            ),
            Err(FrameError::PayloadTooLarge { .. })
        ));
    }

    #[test]
    fn empty_message_is_refused() {
        assert!(matches!(
            FrameHeader::parse([0; HEADER_LEN]),
            Err(FrameError::EmptyMessage)
        ));
    }

    #[test]
    fn unknown_kinds_are_named() {
        let bytes = raw(r#"{"v":1,"kind":"format_disk"}"#, &[]);
        let err = decode::<Request>(&bytes).expect_err("unknown");
        assert!(matches!(&err, FrameError::UnknownKind(k) if k == "format_disk"));
        assert!(err.to_string().contains("format_disk"));
    }

    #[test]
    fn newer_protocol_version_is_refused() {
        let bytes = raw(r#"{"v":2,"kind":"hello"}"#, &[]);
        assert!(matches!(
            decode::<Request>(&bytes),
            Err(FrameError::UnsupportedVersion {
                peer: 2,
                supported: 1
            })
        ));
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        for json in [
            "not json",
            "[1,2]",
            r#"{"kind":"hello"}"#,
            r#"{"v":"1","kind":"hello"}"#,
            r#"{"v":1}"#,
            r#"{"v":1,"kind":7}"#,
            r#"{"v":1,"kind":"quiesce"}"#,
            r#"{"v":1,"kind":"quiesce","timeout_ms":-1}"#,
        ] {
            let err = decode::<Request>(&raw(json, &[])).expect_err(json);
            assert!(matches!(err, FrameError::Malformed(_)), "{json}: {err}");
        }
    }

    #[test]
    fn tamed_messages_keep_their_shape_and_lose_their_hazards() {
        let json = br#"{"v":1,"kind":"activity","input_idle_ms":1,"busy":true,
            "busy_processes":[
              {"pid":1,"comm":"\u001b]0;owned\u0007\u202eevil","cpu_percent":1.0},
              {"pid":2,"comm":"b","cpu_percent":1.0},
              {"pid":3,"comm":"c","cpu_percent":1.0}]}"#;
        let taming = Taming {
            max_bytes: 12,
            max_items: 2,
        };
        let Response::Activity(a) = decode_message_tamed(json, Some(&taming)).expect("decode")
        else {
            panic!("kind");
        };
        assert_eq!(a.busy_processes.len(), 2);
        let comm = &a.busy_processes[0].comm;
        assert!(!comm.chars().any(is_hazardous), "{comm:?}");
        assert!(comm.starts_with("\\u{1b}]0;"), "{comm:?}");
        assert!(comm.len() <= 12);
        assert_eq!(escape_text("ééé", 5), "éé", "cut at a character boundary");
        assert_eq!(escape_text("a\u{7}b", 300), "a\\u{7}b");
        assert_eq!(escape_text("ok", 300), "ok");
        // Escapes are never cut in half.
        assert_eq!(escape_text("ab\u{1b}", 4), "ab");
    }
}
