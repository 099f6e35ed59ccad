//! Screenshots of the root window, encoded as PNG, JPEG or WebP: the whole
//! screen, a region of it at native resolution (zoom), or shrunk to a target
//! size, with the pointer drawn in when asked.
//!
//! Owns reading the screen through X11 `GetImage` (ZPixmap) and turning it
//! into RGB rows, shrinking by area averaging as the rows arrive, and
//! drawing the pointer (XFIXES `GetCursorImage`, or a marker at
//! `QueryPointer` without XFIXES). The screen is read in horizontal strips
//! of at most [`STRIP_BYTES`]. For PNG each strip is encoded as it arrives,
//! so a capture never holds the raw screen in memory (the supervisor's
//! whole budget is 4 MiB RSS); the JPEG and WebP encoders take a whole
//! image, so for those the rows of the (shrunk) image are gathered into one
//! RGB frame, freed as soon as it is encoded ([`encoders`]). Every strip's
//! length is checked against `stride × rows`, so a capture is either
//! complete or an error, never a silently short image. At most one capture
//! runs at a time ([`CAPTURE_SLOT`]); nothing is kept after returning it.

use std::io::Write;
use std::time::{Duration, Instant};

use dormouse_protocol::image::{ImageEncoding, ImageFormat};
use x11rb::connection::Connection as _;
use x11rb::protocol::xproto::ImageFormat as XImageFormat;
use x11rb::protocol::xproto::{self, ConnectionExt as _, ImageOrder, VisualClass};
use x11rb::rust_connection::RustConnection;

use crate::config::Config;
use crate::x_client::{self, XError};

mod encoders;
mod pointer;
mod unchanged;

pub use encoders::{is_too_large, BoundedVec, CountingWriter};
use pointer::Overlay;

/// Largest raw strip read with one `GetImage`.
pub const STRIP_BYTES: usize = 128 * 1024;

/// One capture at a time: the socket's `screenshot` and the self-probe share it.
pub static CAPTURE_SLOT: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Why a screenshot could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ScreenshotError {
    /// The X display could not be used.
    #[error(transparent)]
    X(#[from] XError),
    /// A strip came back shorter or longer than the screen's format says.
    #[error("incomplete capture: rows {row}..{end} returned {got} bytes, expected {expected}")]
    Incomplete {
        /// First row of the strip.
        row: u32,
        /// One past its last row.
        end: u32,
        /// Bytes that came back.
        got: usize,
        /// Bytes the format demands.
        expected: usize,
    },
    /// The screen's pixel format is not a true-colour one this code reads.
    #[error("unsupported screen format: {0}")]
    Unsupported(String),
    /// PNG encoding failed (only a broken writer can cause this).
    #[error("png encoding failed: {0}")]
    Encode(#[from] png::EncodingError),
    /// JPEG encoding failed (a broken writer, or a side over 65535).
    #[error("jpeg encoding failed: {0}")]
    Jpeg(#[from] jpeg_encoder::EncodingError),
    /// WebP encoding failed (a broken writer, or a side over 16384).
    #[error("webp encoding failed: {0}")]
    Webp(#[from] image_webp::EncodingError),
}

/// What a capture produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureStats {
    /// Width of the root window.
    pub width: u32,
    /// Height of the root window.
    pub height: u32,
    /// Size of the image written.
    pub bytes: u64,
    /// Number of `GetImage` strips read.
    pub strips: u32,
}

/// An image of the whole screen.
#[derive(Debug, Clone)]
pub struct Screenshot {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// The format of `image`.
    pub format: ImageFormat,
    /// The encoded file.
    pub image: Vec<u8>,
    /// How long capturing and encoding took.
    pub elapsed: Duration,
}

/// The socket's last whole screen while nothing is drawn ([`unchanged`]);
/// only a capture holding [`CAPTURE_SLOT`] uses it.
static UNCHANGED: std::sync::Mutex<unchanged::Unchanged> =
    std::sync::Mutex::new(unchanged::Unchanged::new());

/// Captures the whole screen of the configured display in `encoding`,
/// bounded by `config.probe_timeout_ms` (waiting for another capture
/// included). The image of the last call is answered again while nothing
/// has been drawn since ([`unchanged`]).
pub async fn capture(
    config: &Config,
    encoding: ImageEncoding,
) -> Result<Screenshot, ScreenshotError> {
    let bound = Duration::from_millis(config.probe_timeout_ms);
    let started = Instant::now();
    let _slot = tokio::time::timeout(bound, CAPTURE_SLOT.acquire())
        .await
        .map_err(|_| XError::Timeout(bound))?
        .map_err(|e| XError::Join(e.to_string()))?;
    let remaining = bound.saturating_sub(started.elapsed());
    let spec = CaptureSpec {
        encoding,
        ..CaptureSpec::default()
    };
    let x_socket = config.x_socket_path();
    let work = x_client::with_display(config, remaining, move |conn, screen| {
        let mut unchanged = UNCHANGED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = unchanged.reuse(&x_socket, spec.encoding) {
            return Ok(kept);
        }
        // A noisy screen of the largest size could make an image bigger than
        // a frame may carry; stop there instead of growing without bound.
        let mut image = BoundedVec::new(
            usize::try_from(dormouse_protocol::MAX_PAYLOAD_LEN).unwrap_or(usize::MAX),
        );
        let stats = encode(conn, screen, &spec, &mut image).map_err(into_x_error)?;
        let image = image.into_inner();
        unchanged.keep(spec.encoding, stats, &image);
        Ok((stats, image))
    });
    // `with_display` ends its own connection at the bound, then waits for
    // the work; the watch's connection is ended here at the same bound, so
    // a display that stops answering cannot hold the work past it.
    tokio::pin!(work);
    let (stats, image) = tokio::select! {
        done = &mut work => done?,
        () = tokio::time::sleep(remaining) => {
            unchanged::interrupt();
            work.await?
        }
    };
    Ok(Screenshot {
        width: stats.width,
        height: stats.height,
        format: encoding.format,
        image,
        elapsed: started.elapsed(),
    })
}

// `with_display` speaks `XError`; keep the screenshot's own reasons readable
// through it.
fn into_x_error(e: ScreenshotError) -> XError {
    match e {
        ScreenshotError::X(x) => x,
        other => XError::Unexpected(other.to_string()),
    }
}

/// One colour channel of a true-colour visual: where its bits sit in a pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Channel {
    mask: u32,
    shift: u32,
    max: u32,
}

impl Channel {
    /// A channel from its mask, which must be one contiguous run of bits.
    fn from_mask(mask: u32) -> Option<Self> {
        if mask == 0 {
            return None;
        }
        let shift = mask.trailing_zeros();
        let max = mask >> shift;
        // Contiguous: the shifted mask is 2^n - 1.
        (max & max.wrapping_add(1) == 0).then_some(Self { mask, shift, max })
    }

    /// The channel's intensity scaled to 8 bits.
    fn decode(self, pixel: u32) -> u8 {
        let v = u64::from((pixel & self.mask) >> self.shift);
        let max = u64::from(self.max);
        // v <= max, so the quotient is at most 255.
        u8::try_from((v * 255 + max / 2) / max).unwrap_or(u8::MAX)
    }
}

/// How the server lays out pixels of the root window's depth and visual.
#[derive(Debug, Clone, Copy)]
struct PixelFormat {
    bits_per_pixel: u8,
    /// Bytes of one row of the whole root window.
    stride: usize,
    /// Rows are padded to a multiple of this many bits.
    pad_bits: usize,
    lsb_first: bool,
    red: Channel,
    green: Channel,
    blue: Channel,
}

impl PixelFormat {
    fn of_root(
        conn: &RustConnection,
        screen: usize,
    ) -> Result<(Self, xproto::Window, u32, u32), ScreenshotError> {
        let setup = conn.setup();
        let root = x_client::screen(conn, screen)
            .map_err(|_| ScreenshotError::Unsupported(format!("no screen {screen}")))?;
        let depth = root.root_depth;
        let format = setup
            .pixmap_formats
            .iter()
            .find(|f| f.depth == depth)
            .ok_or_else(|| {
                ScreenshotError::Unsupported(format!("no pixmap format for depth {depth}"))
            })?;
        let visual = root
            .allowed_depths
            .iter()
            .flat_map(|d| d.visuals.iter())
            .find(|v| v.visual_id == root.root_visual)
            .ok_or_else(|| ScreenshotError::Unsupported("root visual not listed".into()))?;
        if visual.class != VisualClass::TRUE_COLOR && visual.class != VisualClass::DIRECT_COLOR {
            return Err(ScreenshotError::Unsupported(format!(
                "visual class {:?} is not true colour",
                visual.class
            )));
        }
        if !matches!(format.bits_per_pixel, 16 | 24 | 32) {
            return Err(ScreenshotError::Unsupported(format!(
                "{} bits per pixel",
                format.bits_per_pixel
            )));
        }
        let component = |mask: u32| {
            Channel::from_mask(mask)
                .ok_or_else(|| ScreenshotError::Unsupported(format!("colour mask {mask:#x}")))
        };
        let width = u32::from(root.width_in_pixels);
        let pad = usize::from(format.scanline_pad.max(8));
        let row_bits = width as usize * usize::from(format.bits_per_pixel);
        let stride = row_bits.div_ceil(pad) * pad / 8;
        Ok((
            Self {
                bits_per_pixel: format.bits_per_pixel,
                stride,
                pad_bits: pad,
                lsb_first: setup.image_byte_order == ImageOrder::LSB_FIRST,
                red: component(visual.red_mask)?,
                green: component(visual.green_mask)?,
                blue: component(visual.blue_mask)?,
            },
            root.root,
            width,
            u32::from(root.height_in_pixels),
        ))
    }

    /// Bytes of one row of `width` pixels in a `GetImage` reply.
    fn stride_for(&self, width: u32, pad_bits: usize) -> usize {
        let row_bits = width as usize * usize::from(self.bits_per_pixel);
        row_bits.div_ceil(pad_bits) * pad_bits / 8
    }

    /// The common case: 32-bit little-endian `0x00RRGGBB`, converted by
    /// shuffling bytes instead of decoding every pixel through the masks.
    fn is_bgrx(&self) -> bool {
        self.bits_per_pixel == 32
            && self.lsb_first
            && self.red.mask == 0x00ff_0000
            && self.green.mask == 0x0000_ff00
            && self.blue.mask == 0x0000_00ff
    }

    fn row_to_rgb(&self, row: &[u8], width: usize, out: &mut [u8]) {
        if self.is_bgrx() {
            for (px, rgb) in row.chunks_exact(4).take(width).zip(out.chunks_exact_mut(3)) {
                rgb[0] = px[2];
                rgb[1] = px[1];
                rgb[2] = px[0];
            }
            return;
        }
        let bytes = usize::from(self.bits_per_pixel / 8);
        for (px, rgb) in row
            .chunks_exact(bytes)
            .take(width)
            .zip(out.chunks_exact_mut(3))
        {
            let pixel = if self.lsb_first {
                px.iter()
                    .rev()
                    .fold(0u32, |acc, b| (acc << 8) | u32::from(*b))
            } else {
                px.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b))
            };
            rgb[0] = self.red.decode(pixel);
            rgb[1] = self.green.decode(pixel);
            rgb[2] = self.blue.decode(pixel);
        }
    }
}

/// Reads the whole root window of `screen` strip by strip and writes it as
/// an RGB PNG to `out`. Runs on a blocking thread.
pub fn encode_root(
    conn: &RustConnection,
    screen: usize,
    out: impl Write,
) -> Result<CaptureStats, ScreenshotError> {
    encode(conn, screen, &CaptureSpec::default(), out)
}

/// A rectangle of the screen in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
}

/// What to capture: the default is the whole screen at its own size without
/// the pointer, as a PNG.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CaptureSpec {
    /// The part of the screen (all of it when `None`); must lie inside it.
    pub region: Option<Rect>,
    /// The PNG's size when smaller than the region (each side at most the
    /// region's; the caller keeps the aspect, see
    /// `dormouse_protocol::actions::Space::fit`).
    pub size: Option<(u32, u32)>,
    /// Draw the pointer into the image.
    pub cursor: bool,
    /// The format and quality (checked by the caller:
    /// [`ImageEncoding::check`]).
    pub encoding: ImageEncoding,
}

/// Reads the region of `spec` strip by strip and writes it in the format of
/// `spec`, at its size, to `out`, drawing the pointer in when asked. Runs on
/// a blocking thread. Memory for PNG: one strip, one RGB row and, when
/// shrinking, one row of sums; JPEG and WebP add the RGB frame of the
/// target size and what their encoders hold.
pub fn encode(
    conn: &RustConnection,
    screen: usize,
    spec: &CaptureSpec,
    out: impl Write,
) -> Result<CaptureStats, ScreenshotError> {
    let plan = Plan::of(conn, screen, spec)?;
    let (width, height) = (plan.width, plan.height);
    let mut counter = CountingWriter {
        inner: out,
        count: 0,
    };
    let strips = match spec.encoding.format {
        ImageFormat::Png => {
            let mut encoder = png::Encoder::new(&mut counter, width, height);
            encoder.set_color(png::ColorType::Rgb);
            encoder.set_depth(png::BitDepth::Eight);
            // Fast deflate: a screenshot is read once, and the probe takes
            // one on every container start.
            encoder.set_compression(png::Compression::Fast);
            let mut writer = encoder.write_header()?;
            let mut stream = writer.stream_writer_with_size(64 * 1024)?;
            let strips = plan.read_rows(conn, |row| {
                stream.write_all(row).map_err(png::EncodingError::from)?;
                Ok(())
            })?;
            stream.finish()?;
            writer.finish()?;
            strips
        }
        format => {
            let mut frame = Vec::with_capacity(width as usize * height as usize * 3);
            let strips = plan.read_rows(conn, |row| {
                frame.extend_from_slice(row);
                Ok(())
            })?;
            encoders::encode_frame(
                format,
                spec.encoding.quality(),
                &frame,
                width,
                height,
                &mut counter,
            )?;
            strips
        }
    };
    Ok(CaptureStats {
        width,
        height,
        bytes: counter.count,
        strips,
    })
}

/// A checked capture: the screen's pixel format, the region, the target
/// size, the pointer to draw.
#[derive(Debug)]
struct Plan {
    format: PixelFormat,
    root: xproto::Window,
    rect: Rect,
    /// Bytes of one row of the region in a `GetImage` reply.
    stride: usize,
    width: u32,
    height: u32,
    overlay: Option<Overlay>,
}

impl Plan {
    fn of(
        conn: &RustConnection,
        screen: usize,
        spec: &CaptureSpec,
    ) -> Result<Self, ScreenshotError> {
        let (format, root, screen_w, screen_h) = PixelFormat::of_root(conn, screen)?;
        if screen_w == 0 || screen_h == 0 {
            return Err(ScreenshotError::Unsupported(format!(
                "empty screen {screen_w}x{screen_h}"
            )));
        }
        let rect = spec.region.unwrap_or(Rect {
            x: 0,
            y: 0,
            width: screen_w,
            height: screen_h,
        });
        if rect.width == 0
            || rect.height == 0
            || rect.x.saturating_add(rect.width) > screen_w
            || rect.y.saturating_add(rect.height) > screen_h
        {
            return Err(ScreenshotError::Unsupported(format!(
                "region {rect:?} outside the {screen_w}x{screen_h} screen"
            )));
        }
        let (width, height) = spec.size.unwrap_or((rect.width, rect.height));
        if !(1..=rect.width).contains(&width) || !(1..=rect.height).contains(&height) {
            return Err(ScreenshotError::Unsupported(format!(
                "target {width}x{height} for a {}x{} region",
                rect.width, rect.height
            )));
        }
        spec.encoding
            .check()
            .map_err(|e| ScreenshotError::Unsupported(e.to_string()))?;
        let overlay = if spec.cursor {
            Some(Overlay::of_pointer(conn, root)?)
        } else {
            None
        };
        let stride = if rect.width == screen_w {
            format.stride
        } else {
            format.stride_for(rect.width, format.pad_bits)
        };
        Ok(Self {
            format,
            root,
            rect,
            stride,
            width,
            height,
            overlay,
        })
    }

    /// Reads the region strip by strip and hands each RGB row of the target
    /// size to `row`, top to bottom; answers the number of strips read.
    fn read_rows(
        &self,
        conn: &RustConnection,
        mut row_out: impl FnMut(&[u8]) -> Result<(), ScreenshotError>,
    ) -> Result<u32, ScreenshotError> {
        let (rect, stride) = (self.rect, self.stride);
        let mut shrink = ((self.width, self.height) != (rect.width, rect.height))
            .then(|| Shrink::new(rect.width, rect.height, self.width, self.height));
        let x = i16::try_from(rect.x)
            .map_err(|_| ScreenshotError::Unsupported(format!("x {}", rect.x)))?;
        let w = u16::try_from(rect.width)
            .map_err(|_| ScreenshotError::Unsupported(format!("width {}", rect.width)))?;
        let rows_per_strip = (STRIP_BYTES / stride.max(1)).clamp(1, usize::from(u16::MAX));
        let rows_per_strip = u32::try_from(rows_per_strip).unwrap_or(u32::from(u16::MAX));
        let mut rgb = vec![0u8; rect.width as usize * 3];
        let mut row = 0u32;
        let mut strips = 0u32;
        while row < rect.height {
            let rows = (rect.height - row).min(rows_per_strip);
            let top = rect.y + row;
            let reply = conn
                .get_image(
                    XImageFormat::Z_PIXMAP,
                    self.root,
                    x,
                    i16::try_from(top)
                        .map_err(|_| ScreenshotError::Unsupported(format!("row {top}")))?,
                    w,
                    u16::try_from(rows).unwrap_or(u16::MAX),
                    !0,
                )
                .map_err(XError::from)?
                .reply()
                .map_err(XError::from)?;
            let expected = stride * rows as usize;
            if reply.data.len() != expected {
                return Err(ScreenshotError::Incomplete {
                    row,
                    end: row + rows,
                    got: reply.data.len(),
                    expected,
                });
            }
            for (i, line) in reply.data.chunks_exact(stride).enumerate() {
                self.format.row_to_rgb(line, rect.width as usize, &mut rgb);
                if let Some(o) = &self.overlay {
                    o.draw(top + u32::try_from(i).unwrap_or(0), rect.x, &mut rgb);
                }
                match shrink.as_mut() {
                    None => row_out(&rgb)?,
                    Some(s) => {
                        if let Some(done) = s.push(&rgb) {
                            row_out(done)?;
                        }
                    }
                }
            }
            row += rows;
            strips += 1;
        }
        Ok(strips)
    }
}

/// Shrinks RGB rows by averaging the source pixels that fall into each
/// target pixel (a box filter), one target row at a time.
#[derive(Debug)]
struct Shrink {
    src_h: u64,
    out_h: u64,
    /// Target column of each source column.
    column: Vec<usize>,
    /// Source columns per target column.
    per_column: Vec<u64>,
    sums: Vec<u64>,
    rows_in: u64,
    src_row: u64,
    out_row: u64,
    out: Vec<u8>,
}

impl Shrink {
    fn new(src_w: u32, src_h: u32, out_w: u32, out_h: u32) -> Self {
        let column: Vec<usize> = (0..u64::from(src_w))
            .map(|x| usize::try_from(x * u64::from(out_w) / u64::from(src_w)).unwrap_or(0))
            .collect();
        let mut per_column = vec![0u64; out_w as usize];
        for c in &column {
            if let Some(n) = per_column.get_mut(*c) {
                *n += 1;
            }
        }
        Self {
            src_h: u64::from(src_h),
            out_h: u64::from(out_h),
            column,
            per_column,
            sums: vec![0; out_w as usize * 3],
            rows_in: 0,
            src_row: 0,
            out_row: 0,
            out: vec![0; out_w as usize * 3],
        }
    }

    /// Adds one source row; answers a finished target row when this source
    /// row was the last one falling into it.
    fn push(&mut self, rgb: &[u8]) -> Option<&[u8]> {
        for (px, c) in rgb.chunks_exact(3).zip(&self.column) {
            if let Some(sum) = self.sums.get_mut(c * 3..c * 3 + 3) {
                sum[0] += u64::from(px[0]);
                sum[1] += u64::from(px[1]);
                sum[2] += u64::from(px[2]);
            }
        }
        self.rows_in += 1;
        self.src_row += 1;
        // The target row of the next source row; a change ends this one.
        let next = self.src_row * self.out_h / self.src_h;
        if next == self.out_row && self.src_row < self.src_h {
            return None;
        }
        for (i, (sum, out)) in self.sums.iter_mut().zip(self.out.iter_mut()).enumerate() {
            let n = (self.per_column.get(i / 3).copied().unwrap_or(1) * self.rows_in).max(1);
            *out = u8::try_from((*sum + n / 2) / n).unwrap_or(u8::MAX);
            *sum = 0;
        }
        self.rows_in = 0;
        self.out_row = next;
        Some(&self.out)
    }
}

#[cfg(test)]
mod tests;
