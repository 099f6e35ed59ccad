//! The encoders of a whole gathered frame (JPEG, WebP) and the writers a
//! capture writes through: [`CountingWriter`] for its size, [`BoundedVec`]
//! so it never outgrows a frame's payload.
//!
//! The JPEG encoder (`jpeg-encoder`) and the WebP one (`image-webp`, lossless
//! VP8L only) both take a whole RGB image; PNG streams and never reaches
//! here. What `quality` means for each is `dormouse_protocol::image`'s.

use std::io::Write;

use dormouse_protocol::image::{ImageFormat, WEBP_PREDICTOR_QUALITY};

use super::ScreenshotError;

/// Encodes the RGB `frame` of `width`×`height` as `format` into `out`. PNG
/// is not encoded here (it streams) and is refused.
pub(super) fn encode_frame(
    format: ImageFormat,
    quality: u8,
    frame: &[u8],
    width: u32,
    height: u32,
    out: impl Write,
) -> Result<(), ScreenshotError> {
    match format {
        ImageFormat::Jpeg => {
            let side = |v: u32| {
                u16::try_from(v).map_err(|_| ScreenshotError::Unsupported(format!("jpeg side {v}")))
            };
            let encoder = jpeg_encoder::Encoder::new(out, quality);
            encoder.encode(
                frame,
                side(width)?,
                side(height)?,
                jpeg_encoder::ColorType::Rgb,
            )?;
        }
        ImageFormat::Webp => {
            let expected = u64::from(width) * u64::from(height) * 3;
            if u64::try_from(frame.len()).ok() != Some(expected) {
                // The encoder panics on a short frame; never hand it one.
                return Err(ScreenshotError::Unsupported(format!(
                    "{} bytes for a {width}x{height} frame",
                    frame.len()
                )));
            }
            let mut encoder = image_webp::WebPEncoder::new(out);
            let mut params = image_webp::EncoderParams::default();
            params.use_predictor_transform = quality >= WEBP_PREDICTOR_QUALITY;
            encoder.set_params(params);
            encoder.encode(frame, width, height, image_webp::ColorType::Rgb8)?;
        }
        ImageFormat::Png => {
            return Err(ScreenshotError::Unsupported(
                "png streams; it has no whole-frame encoder".into(),
            ))
        }
    }
    Ok(())
}

/// Counts what passes through, so the probe can encode into a sink and still
/// report the image's size.
#[derive(Debug)]
pub struct CountingWriter<W> {
    /// Where the bytes go.
    pub inner: W,
    /// Bytes written so far.
    pub count: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A `Vec` that refuses to grow past `limit`.
#[derive(Debug)]
pub struct BoundedVec {
    bytes: Vec<u8>,
    limit: usize,
}

impl BoundedVec {
    /// An empty one holding at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            bytes: Vec::new(),
            limit,
        }
    }

    /// The bytes written.
    pub fn into_inner(self) -> Vec<u8> {
        self.bytes
    }
}

/// Whether a capture failed because its image outgrew its [`BoundedVec`].
pub fn is_too_large(e: &ScreenshotError) -> bool {
    let io = match e {
        ScreenshotError::Encode(png::EncodingError::IoError(io))
        | ScreenshotError::Jpeg(jpeg_encoder::EncodingError::IoError(io))
        | ScreenshotError::Webp(image_webp::EncodingError::IoError(io)) => io,
        _ => return false,
    };
    io.kind() == std::io::ErrorKind::FileTooLarge
}

impl Write for BoundedVec {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                format!(
                    "the image exceeds the frame payload limit of {} bytes",
                    self.limit
                ),
            ));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
