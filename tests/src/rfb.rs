//! A raw RFB viewer over the broker's screen WebSocket, and a fake VNC server
//! on a unix socket that records what reaches it.
//!
//! The viewer speaks RFB 3.8 with security None byte by byte (no library
//! between the test and the wire), so a test can send exactly the messages
//! it means, malformed ones included. The fake server plays a desktop's
//! `vnc.sock`: it does the server side of the handshake, records every byte
//! a viewer's connection delivers after it, and can stream framebuffer
//! updates to every connection on its own. Neither ever decides what is
//! allowed; that is the gateway's job, and these only witness it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// RFB message types a viewer sends.
pub mod client_msg {
    /// SetPixelFormat.
    pub const SET_PIXEL_FORMAT: u8 = 0;
    /// SetEncodings.
    pub const SET_ENCODINGS: u8 = 2;
    /// FramebufferUpdateRequest.
    pub const UPDATE_REQUEST: u8 = 3;
    /// KeyEvent.
    pub const KEY: u8 = 4;
    /// PointerEvent.
    pub const POINTER: u8 = 5;
    /// ClientCutText.
    pub const CUT_TEXT: u8 = 6;
}

/// `KeyEvent` bytes.
pub fn key_event(down: bool, keysym: u32) -> Vec<u8> {
    let mut v = vec![client_msg::KEY, u8::from(down), 0, 0];
    v.extend_from_slice(&keysym.to_be_bytes());
    v
}

/// `PointerEvent` bytes.
pub fn pointer_event(buttons: u8, x: u16, y: u16) -> Vec<u8> {
    let mut v = vec![client_msg::POINTER, buttons];
    v.extend_from_slice(&x.to_be_bytes());
    v.extend_from_slice(&y.to_be_bytes());
    v
}

/// `ClientCutText` bytes.
pub fn cut_text(text: &[u8]) -> Vec<u8> {
    let mut v = vec![client_msg::CUT_TEXT, 0, 0, 0];
    v.extend_from_slice(&u32::try_from(text.len()).unwrap().to_be_bytes());
    v.extend_from_slice(text);
    v
}

/// `FramebufferUpdateRequest` bytes for the rectangle.
pub fn update_request(incremental: bool, x: u16, y: u16, w: u16, h: u16) -> Vec<u8> {
    let mut v = vec![client_msg::UPDATE_REQUEST, u8::from(incremental)];
    for n in [x, y, w, h] {
        v.extend_from_slice(&n.to_be_bytes());
    }
    v
}

/// `SetEncodings` bytes.
pub fn set_encodings(encodings: &[i32]) -> Vec<u8> {
    let mut v = vec![client_msg::SET_ENCODINGS, 0];
    v.extend_from_slice(&u16::try_from(encodings.len()).unwrap().to_be_bytes());
    for e in encodings {
        v.extend_from_slice(&e.to_be_bytes());
    }
    v
}

/// `SetPixelFormat` to 32 bpp, depth 24, little-endian true colour
/// (red at bit 16, green 8, blue 0), so pixels read as `[b, g, r, 0]`.
pub fn set_pixel_format_bgrx() -> Vec<u8> {
    vec![
        client_msg::SET_PIXEL_FORMAT,
        0,
        0,
        0,
        32,
        24,
        0,
        1,
        0,
        255,
        0,
        255,
        0,
        255,
        16,
        8,
        0,
        0,
        0,
        0,
    ]
}

/// What the server said in ServerInit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInit {
    /// Framebuffer width.
    pub width: u16,
    /// Framebuffer height.
    pub height: u16,
    /// The 16 bytes of the server's pixel format.
    pub pixel_format: [u8; 16],
    /// The desktop's name.
    pub name: String,
}

/// One rectangle of a framebuffer update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rect {
    /// Left.
    pub x: u16,
    /// Top.
    pub y: u16,
    /// Width.
    pub w: u16,
    /// Height.
    pub h: u16,
    /// Encoding (0 = Raw, 16 = ZRLE; pseudo-encodings carry no pixels
    /// here).
    pub encoding: i32,
    /// Raw pixels, 4 bytes each (only for Raw at 32 bpp).
    pub pixels: Vec<u8>,
    /// Bytes of the rectangle's data on the wire (after its header).
    pub wire: usize,
}

/// How a screen WebSocket ended, as the viewer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The close code, if a close frame came.
    pub code: Option<u16>,
    /// Its reason.
    pub reason: String,
}

/// A viewer on the screen WebSocket.
#[derive(Debug)]
pub struct RfbViewer {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    buf: Vec<u8>,
    /// The subprotocol the gateway selected.
    pub protocol: Option<String>,
    /// xvp messages from the server (version, code), in the order
    /// [`Self::read_update`] met them.
    pub xvp: Vec<(u8, u8)>,
    /// The text of every plain ServerCutText [`Self::read_update`] met.
    pub cut_texts: Vec<Vec<u8>>,
    /// How many extended-clipboard ServerCutText messages it met (a
    /// provide's text also goes to [`Self::cut_texts`]).
    pub extended_cut_texts: usize,
    /// The flags of each extended-clipboard message, in order.
    pub extended_flags: Vec<u32>,
}

/// How to present the screen token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenIn {
    /// `Sec-WebSocket-Protocol: binary, dormouse.screen.<token>`.
    Subprotocol,
    /// `?token=<token>`.
    Query,
}

impl RfbViewer {
    /// Opens `ws_url` (e.g. `ws://127.0.0.1:port/v1/screens/<id>/rfb`).
    /// An HTTP refusal comes back as an error whose text has the status.
    pub async fn connect(ws_url: &str, token: &str, how: TokenIn) -> Result<Self> {
        let url = match how {
            TokenIn::Subprotocol => ws_url.to_owned(),
            TokenIn::Query => format!("{ws_url}?token={token}"),
        };
        let mut req = url.into_client_request()?;
        let protocols = match how {
            TokenIn::Subprotocol => format!("binary, dormouse.screen.{token}"),
            TokenIn::Query => "binary".to_owned(),
        };
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", HeaderValue::from_str(&protocols)?);
        Self::open(req).await
    }

    /// Opens with any request (for tests of refusals: bearer headers, other
    /// subprotocols).
    pub async fn open(
        req: tokio_tungstenite::tungstenite::handshake::client::Request,
    ) -> Result<Self> {
        // Without Nagle, as browsers open WebSockets: the handshake's small
        // messages would otherwise wait for the peer's delayed ACK.
        let (ws, response) = tokio_tungstenite::connect_async_with_config(req, None, true)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(r) => anyhow::anyhow!(
                    "refused: {} {}",
                    r.status().as_u16(),
                    r.body()
                        .as_ref()
                        .map(|b| String::from_utf8_lossy(b).into_owned())
                        .unwrap_or_default()
                ),
                other => anyhow::anyhow!("websocket: {other}"),
            })?;
        let protocol = response
            .headers()
            .get("Sec-WebSocket-Protocol")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok(Self {
            ws,
            buf: Vec::new(),
            protocol,
            xvp: Vec::new(),
            cut_texts: Vec::new(),
            extended_cut_texts: 0,
            extended_flags: Vec::new(),
        })
    }

    /// Sends bytes as one binary message.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.ws.send(Message::binary(bytes.to_vec())).await?;
        Ok(())
    }

    /// Sends a text message (RFB has none; the gateway must refuse it).
    pub async fn send_text(&mut self, text: &str) -> Result<()> {
        self.ws.send(Message::text(text.to_owned())).await?;
        Ok(())
    }

    /// Reads until `n` bytes are buffered, then takes them.
    pub async fn read_exact(&mut self, n: usize) -> Result<Vec<u8>> {
        while self.buf.len() < n {
            match self.ws.next().await {
                Some(Ok(Message::Binary(b))) => self.buf.extend_from_slice(&b),
                Some(Ok(Message::Close(frame))) => bail!(
                    "closed: {:?}",
                    frame.map(|f| (u16::from(f.code), f.reason.to_string()))
                ),
                Some(Ok(_)) => {}
                Some(Err(e)) => bail!("websocket: {e}"),
                None => bail!("websocket ended"),
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Waits at most `within` for bytes to read; whether some are buffered.
    /// Cancel-safe, unlike a timeout around [`Self::read_update`] (which
    /// could stop inside a message): a message read here is kept whole.
    pub async fn readable(&mut self, within: Duration) -> Result<bool> {
        if !self.buf.is_empty() {
            return Ok(true);
        }
        match tokio::time::timeout(within, self.ws.next()).await {
            Err(_) => Ok(false),
            Ok(Some(Ok(Message::Binary(b)))) => {
                self.buf.extend_from_slice(&b);
                Ok(!self.buf.is_empty())
            }
            Ok(Some(Ok(Message::Close(frame)))) => bail!(
                "closed: {:?}",
                frame.map(|f| (u16::from(f.code), f.reason.to_string()))
            ),
            Ok(Some(Ok(_))) => Ok(false),
            Ok(Some(Err(e))) => bail!("websocket: {e}"),
            Ok(None) => bail!("websocket ended"),
        }
    }

    /// The next byte to be read, if one is buffered (a message's type
    /// after [`Self::readable`]).
    pub fn peek(&self) -> Option<u8> {
        self.buf.first().copied()
    }

    /// Reads whatever comes next (at least one byte).
    pub async fn read_some(&mut self) -> Result<Vec<u8>> {
        if self.buf.is_empty() {
            let mut first = self.read_exact(1).await?;
            first.append(&mut self.buf);
            return Ok(first);
        }
        Ok(std::mem::take(&mut self.buf))
    }

    /// The client side of the handshake: version 3.8, security None,
    /// ClientInit shared.
    pub async fn handshake(&mut self) -> Result<ServerInit> {
        let version = self.read_exact(12).await?;
        ensure!(version.starts_with(b"RFB 003."), "banner {version:?}");
        self.send(b"RFB 003.008\n").await?;
        let count = self.read_exact(1).await?[0];
        ensure!(count > 0, "the server offered no security type");
        let types = self.read_exact(usize::from(count)).await?;
        ensure!(types.contains(&1), "no security None among {types:?}");
        self.send(&[1]).await?;
        let result = self.read_exact(4).await?;
        ensure!(result == [0, 0, 0, 0], "security result {result:?}");
        self.send(&[1]).await?;
        let init = self.read_exact(24).await?;
        let width = u16::from_be_bytes([init[0], init[1]]);
        let height = u16::from_be_bytes([init[2], init[3]]);
        let mut pixel_format = [0u8; 16];
        pixel_format.copy_from_slice(&init[4..20]);
        let name_len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]);
        ensure!(name_len <= 4096, "desktop name of {name_len} bytes");
        let name = self.read_exact(usize::try_from(name_len)?).await?;
        Ok(ServerInit {
            width,
            height,
            pixel_format,
            name: String::from_utf8_lossy(&name).into_owned(),
        })
    }

    /// Reads server messages until a FramebufferUpdate and returns its
    /// rectangles: Raw at 32 bpp (pixels kept), ZRLE (its zlib data read
    /// past, not decoded) and pixel-less pseudo-encodings only: ask for
    /// those with [`set_encodings`]`(&[0])` or `(&[16, 0])`; CopyRect,
    /// Hextile, Cursor, DesktopName and ExtendedDesktopSize are read past
    /// too. Bell
    /// messages in between are skipped, cut-text ones kept in
    /// [`Self::cut_texts`] (the extended form counted in
    /// [`Self::extended_cut_texts`]), xvp ones in [`Self::xvp`].
    pub async fn read_update(&mut self) -> Result<Vec<Rect>> {
        loop {
            let kind = self.read_exact(1).await?[0];
            match kind {
                0 => {
                    let head = self.read_exact(3).await?;
                    let n = u16::from_be_bytes([head[1], head[2]]);
                    let mut rects = Vec::with_capacity(usize::from(n));
                    for _ in 0..n {
                        let r = self.read_exact(12).await?;
                        let be = |i: usize| u16::from_be_bytes([r[i], r[i + 1]]);
                        let encoding = i32::from_be_bytes([r[8], r[9], r[10], r[11]]);
                        let (w, h) = (be(4), be(6));
                        let (pixels, wire) = match encoding {
                            0 => {
                                let p =
                                    self.read_exact(usize::from(w) * usize::from(h) * 4).await?;
                                let n = p.len();
                                (p, n)
                            }
                            16 => {
                                let len = self.read_exact(4).await?;
                                let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
                                ensure!(len <= 64 << 20, "a ZRLE rectangle of {len} bytes");
                                self.read_exact(usize::try_from(len)?).await?;
                                (Vec::new(), 4 + usize::try_from(len)?)
                            }
                            1 => (self.read_exact(4).await?, 4),
                            // Hextile at 32 bpp, read past tile by tile.
                            5 => (Vec::new(), self.read_hextile(w, h).await?),
                            // Cursor at 32 bpp: its pixels, then its mask.
                            -239 => {
                                let n = usize::from(w) * usize::from(h) * 4
                                    + usize::from(w).div_ceil(8) * usize::from(h);
                                self.read_exact(n).await?;
                                (Vec::new(), n)
                            }
                            // DesktopName: a length and the name.
                            -307 => {
                                let len = self.read_exact(4).await?;
                                let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
                                ensure!(len <= 4096, "a desktop name of {len} bytes");
                                self.read_exact(usize::try_from(len)?).await?;
                                (Vec::new(), 4 + usize::try_from(len)?)
                            }
                            // ExtendedDesktopSize: a count, then 16 bytes a screen.
                            -308 => {
                                let n = usize::from(self.read_exact(4).await?[0]) * 16;
                                self.read_exact(n).await?;
                                (Vec::new(), 4 + n)
                            }
                            e if e < 0 => (Vec::new(), 0),
                            e => bail!("encoding {e} not supported by this viewer"),
                        };
                        rects.push(Rect {
                            x: be(0),
                            y: be(2),
                            w,
                            h,
                            encoding,
                            pixels,
                            wire,
                        });
                    }
                    return Ok(rects);
                }
                1 => bail!("SetColourMapEntries: the viewer asked for true colour"),
                2 => {}
                3 => {
                    let head = self.read_exact(7).await?;
                    let len = i32::from_be_bytes([head[3], head[4], head[5], head[6]]);
                    ensure!(
                        len.unsigned_abs() <= 1 << 20,
                        "server cut text of {len} bytes"
                    );
                    let text = self
                        .read_exact(usize::try_from(len.unsigned_abs())?)
                        .await?;
                    if len < 0 {
                        self.extended_cut_texts += 1;
                        self.extended_clipboard(&text).await?;
                    } else {
                        self.cut_texts.push(text);
                    }
                }
                // xvp: the server's answer to an xvp message (version,
                // code), kept for the test to look at.
                250 => {
                    let m = self.read_exact(3).await?;
                    self.xvp.push((m[1], m[2]));
                }
                other => bail!("server message type {other} not supported by this viewer"),
            }
        }
    }

    /// Reads past a Hextile rectangle's tiles at 32 bpp; its bytes.
    async fn read_hextile(&mut self, w: u16, h: u16) -> Result<usize> {
        let mut wire = 0;
        for ty in (0..h).step_by(16) {
            for tx in (0..w).step_by(16) {
                let (tw, th) = (usize::from((w - tx).min(16)), usize::from((h - ty).min(16)));
                let se = self.read_exact(1).await?[0];
                let mut n = if se & 1 != 0 {
                    tw * th * 4
                } else {
                    usize::from(se & 2 != 0) * 4 + usize::from(se & 4 != 0) * 4
                };
                if se & 1 == 0 && se & 8 != 0 {
                    self.read_exact(n).await?;
                    wire += n;
                    let count = usize::from(self.read_exact(1).await?[0]);
                    wire += 1;
                    n = count * (2 + if se & 16 != 0 { 4 } else { 0 });
                }
                self.read_exact(n).await?;
                wire += 1 + n;
            }
        }
        Ok(wire)
    }

    /// Answers an extended-clipboard message as noVNC does: its own caps
    /// to the server's, a request for the text to a notify; a provide's
    /// text (zlib: a length and the text, NUL-terminated) goes to
    /// [`Self::cut_texts`].
    async fn extended_clipboard(&mut self, message: &[u8]) -> Result<()> {
        const TEXT: u32 = 1;
        const CAPS: u32 = 1 << 24;
        const REQUEST: u32 = 1 << 25;
        const NOTIFY: u32 = 1 << 27;
        const PROVIDE: u32 = 1 << 28;
        ensure!(
            message.len() >= 4,
            "an extended clipboard message of {message:?}"
        );
        let flags = u32::from_be_bytes([message[0], message[1], message[2], message[3]]);
        self.extended_flags.push(flags);
        let reply = |payload: Vec<u8>| {
            let mut m = vec![6, 0, 0, 0];
            m.extend_from_slice(&(-i32::try_from(payload.len()).unwrap_or(0)).to_be_bytes());
            m.extend_from_slice(&payload);
            m
        };
        if flags & CAPS != 0 {
            let mut caps = (CAPS | REQUEST | NOTIFY | PROVIDE | TEXT)
                .to_be_bytes()
                .to_vec();
            caps.extend_from_slice(&(1u32 << 20).to_be_bytes());
            self.send(&reply(caps)).await?;
        } else if flags & NOTIFY != 0 && flags & TEXT != 0 {
            self.send(&reply((REQUEST | TEXT).to_be_bytes().to_vec()))
                .await?;
        } else if flags & PROVIDE != 0 && flags & TEXT != 0 {
            use std::io::Read as _;
            let mut data = Vec::new();
            flate2::read::ZlibDecoder::new(&message[4..])
                .take(2 << 20)
                .read_to_end(&mut data)?;
            ensure!(data.len() >= 4, "a provide of {} bytes", data.len());
            let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
            let end = (4 + usize::try_from(len)?).min(data.len());
            let mut text = data[4..end].to_vec();
            if text.last() == Some(&0) {
                text.pop();
            }
            self.cut_texts.push(text);
        }
        Ok(())
    }

    /// Waits (at most `within`) for the connection to end, skipping data.
    pub async fn closed(&mut self, within: Duration) -> Result<Closed> {
        tokio::time::timeout(within, async {
            loop {
                match self.ws.next().await {
                    Some(Ok(Message::Close(frame))) => {
                        return Ok(Closed {
                            code: frame.as_ref().map(|f| u16::from(f.code)),
                            reason: frame.map(|f| f.reason.to_string()).unwrap_or_default(),
                        })
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => {
                        return Ok(Closed {
                            code: None,
                            reason: String::new(),
                        })
                    }
                }
            }
        })
        .await
        .context("the connection stayed open")?
    }

    /// Closes politely.
    pub async fn close(mut self) {
        let _ = self
            .ws
            .close(Some(tokio_tungstenite::tungstenite::protocol::CloseFrame {
                code: CloseCode::Normal,
                reason: "bye".into(),
            }))
            .await;
    }
}

#[path = "rfb_fake.rs"]
mod fake;
pub use fake::{fake_update, FakeConnection, FakeVncServer, FAKE_HEIGHT, FAKE_WIDTH};
