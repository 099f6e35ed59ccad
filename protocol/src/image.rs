//! The encodings a screenshot can be asked for: [`ImageFormat`] (PNG, JPEG,
//! WebP), its quality, the media type each carries, and the signature its
//! bytes begin with.
//!
//! This module owns the one check of a requested encoding
//! ([`ImageEncoding::check`]), shared by the API, the action batch and the
//! supervisor, and the one signature test of an encoded image
//! ([`ImageFormat::is_signature_of`]) the broker runs on every image a guest
//! answers. It never encodes anything.
//!
//! `quality` (1..=100, default [`DEFAULT_QUALITY`]) is the JPEG quality for
//! `jpeg`. The WebP encoder is lossless only, so for `webp` `quality` is, as
//! in libwebp's lossless mode, the effort spent: below
//! [`WEBP_PREDICTOR_QUALITY`] the encoder skips its predictor transform
//! (faster, larger); the pixels are exact either way. PNG is lossless and
//! takes no quality.

use serde::{Deserialize, Serialize};

/// The quality used when a `jpeg` or `webp` request names none.
pub const DEFAULT_QUALITY: u8 = 80;

/// The lowest `webp` quality at which the encoder spends the predictor
/// transform (smaller files, more time).
pub const WEBP_PREDICTOR_QUALITY: u8 = 50;

/// How a screenshot is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// PNG, lossless (the default).
    #[default]
    Png,
    /// Baseline JPEG, 4:2:0, at a quality.
    Jpeg,
    /// WebP, lossless (VP8L).
    Webp,
}

/// A requested encoding that cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodingError {
    /// A format name that is not `png`, `jpeg` or `webp`.
    #[error("unknown image format {0:?} (png, jpeg or webp)")]
    UnknownFormat(String),
    /// A quality outside 1..=100.
    #[error("quality {0} is not within 1..=100")]
    Quality(u32),
    /// A quality for PNG, which is lossless and takes none.
    #[error("quality applies to jpeg and webp, not png")]
    QualityOnPng,
}

impl ImageFormat {
    /// Every format, in the order the documentation lists them.
    pub const ALL: [Self; 3] = [Self::Png, Self::Jpeg, Self::Webp];

    /// The wire name (`png`, `jpeg`, `webp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Png => "png",
            Self::Jpeg => "jpeg",
            Self::Webp => "webp",
        }
    }

    /// The media type (`image/png`, `image/jpeg`, `image/webp`).
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Png => "image/png",
            Self::Jpeg => "image/jpeg",
            Self::Webp => "image/webp",
        }
    }

    /// The format whose media type is `media_type`.
    pub fn of_media_type(media_type: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.media_type() == media_type)
    }

    /// Whether `bytes` begin as a file of this format does: the PNG
    /// signature, a JPEG start-of-image marker followed by a marker, or a
    /// RIFF container of form `WEBP`.
    pub fn is_signature_of(self, bytes: &[u8]) -> bool {
        match self {
            Self::Png => bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            Self::Jpeg => bytes.starts_with(&[0xff, 0xd8, 0xff]),
            Self::Webp => {
                bytes.len() >= 12 && bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP")
            }
        }
    }
}

impl std::fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ImageFormat {
    type Err = EncodingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| EncodingError::UnknownFormat(s.to_owned()))
    }
}

/// A format and, for `jpeg` and `webp`, a quality.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageEncoding {
    /// The format (PNG when absent).
    #[serde(default)]
    pub format: ImageFormat,
    /// 1..=100 for `jpeg` and `webp` ([`DEFAULT_QUALITY`] when absent);
    /// refused on `png`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<u8>,
}

impl ImageEncoding {
    /// An encoding from its optional parts, checked.
    ///
    /// # Errors
    /// [`ImageEncoding::check`]'s.
    pub fn new(format: Option<ImageFormat>, quality: Option<u8>) -> Result<Self, EncodingError> {
        let encoding = Self {
            format: format.unwrap_or_default(),
            quality,
        };
        encoding.check()?;
        Ok(encoding)
    }

    /// An encoding from the text of a query (`format=jpeg&quality=30`),
    /// checked; a quality too large for a byte is reported as it was sent.
    ///
    /// # Errors
    /// An unknown format, a quality that is not a number in 1..=100, or a
    /// quality on PNG.
    pub fn parse(format: Option<&str>, quality: Option<&str>) -> Result<Self, EncodingError> {
        let format = format.map(str::parse).transpose()?;
        let quality = match quality {
            None => None,
            Some(q) => {
                let n: u32 = q.trim().parse().map_err(|_| EncodingError::Quality(0))?;
                Some(u8::try_from(n).map_err(|_| EncodingError::Quality(n))?)
            }
        };
        Self::new(format, quality)
    }

    /// Whether this encoding can be made: a quality, if any, in 1..=100 and
    /// not on PNG.
    ///
    /// # Errors
    /// Why not.
    pub fn check(&self) -> Result<(), EncodingError> {
        match (self.format, self.quality) {
            (ImageFormat::Png, Some(_)) => Err(EncodingError::QualityOnPng),
            (_, Some(q)) if !(1..=100).contains(&q) => Err(EncodingError::Quality(u32::from(q))),
            _ => Ok(()),
        }
    }

    /// The quality to encode with ([`DEFAULT_QUALITY`] when none was named).
    pub fn quality(&self) -> u8 {
        self.quality.unwrap_or(DEFAULT_QUALITY)
    }

    /// Whether this is plain PNG, the encoding of a request that names none.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_their_wire_names_and_nothing_else() {
        for f in ImageFormat::ALL {
            assert_eq!(f.as_str().parse::<ImageFormat>(), Ok(f));
            assert_eq!(ImageFormat::of_media_type(f.media_type()), Some(f));
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{}\"", f.as_str()));
        }
        for bad in ["gif", "PNG", "jpg", "", "image/png"] {
            assert_eq!(
                bad.parse::<ImageFormat>(),
                Err(EncodingError::UnknownFormat(bad.to_owned()))
            );
        }
        assert!(serde_json::from_str::<ImageFormat>("\"gif\"").is_err());
    }

    #[test]
    fn quality_is_checked_per_format() {
        use ImageFormat::*;
        assert_eq!(ImageEncoding::new(None, None).map(|e| e.format), Ok(Png));
        assert_eq!(
            ImageEncoding::new(Some(Png), Some(50)),
            Err(EncodingError::QualityOnPng)
        );
        for f in [Jpeg, Webp] {
            for q in [1, 30, 100] {
                assert_eq!(
                    ImageEncoding::new(Some(f), Some(q)).map(|e| e.quality()),
                    Ok(q)
                );
            }
            assert_eq!(
                ImageEncoding::new(Some(f), Some(0)),
                Err(EncodingError::Quality(0))
            );
            assert_eq!(
                ImageEncoding::new(Some(f), Some(101)),
                Err(EncodingError::Quality(101))
            );
            assert_eq!(
                ImageEncoding::new(Some(f), None).map(|e| e.quality()),
                Ok(DEFAULT_QUALITY)
            );
        }
    }

    #[test]
    fn query_text_parses_and_refuses() {
        let ok = ImageEncoding::parse(Some("jpeg"), Some("30")).unwrap();
        assert_eq!((ok.format, ok.quality), (ImageFormat::Jpeg, Some(30)));
        assert_eq!(
            ImageEncoding::parse(None, None),
            Ok(ImageEncoding::default())
        );
        assert_eq!(
            ImageEncoding::parse(Some("webp"), Some("300")),
            Err(EncodingError::Quality(300))
        );
        assert_eq!(
            ImageEncoding::parse(Some("webp"), Some("high")),
            Err(EncodingError::Quality(0))
        );
        assert_eq!(
            ImageEncoding::parse(Some("bmp"), None),
            Err(EncodingError::UnknownFormat("bmp".into()))
        );
        assert_eq!(
            ImageEncoding::parse(None, Some("90")),
            Err(EncodingError::QualityOnPng)
        );
    }

    #[test]
    fn signatures_tell_the_formats_apart() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".as_slice();
        let jpeg = [0xff, 0xd8, 0xff, 0xe0, 0, 0x10, b'J', b'F'];
        let webp = b"RIFF\x10\0\0\0WEBPVP8L".as_slice();
        let samples: [(ImageFormat, &[u8]); 3] = [
            (ImageFormat::Png, png),
            (ImageFormat::Jpeg, &jpeg),
            (ImageFormat::Webp, webp),
        ];
        for (f, bytes) in samples {
            for (g, _) in samples {
                assert_eq!(g.is_signature_of(bytes), f == g, "{g} on {f}'s bytes");
            }
            assert!(!f.is_signature_of(&bytes[..3.min(bytes.len()) - 1]));
            assert!(!f.is_signature_of(b""));
        }
        assert!(!ImageFormat::Webp.is_signature_of(b"RIFF\0\0\0\0WAVEfmt "));
    }
}
