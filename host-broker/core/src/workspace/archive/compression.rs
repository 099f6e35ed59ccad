//! The compression of an archive: recognised by an import from the
//! stream's first bytes and undone as it streams, applied by an export.
//!
//! A stream that is no tar says what it looks like instead (a zip, xz,
//! bzip2, …) in words. Errors of a decoder are told apart from errors of
//! the stream under it (a body that broke off), so a corrupt or truncated
//! compressed stream is refused as such. Nothing here buffers more than a
//! decoder's window.

use std::cell::Cell;
use std::io::{self, Read, Write};
use std::rc::Rc;

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;

use super::budget::Exceeded;
use super::{Compression, Refusal};

/// gzip level of an export: fast, most of the ratio of the default.
const GZIP_LEVEL: u32 = 3;
/// zstd level of an export (zstd's own default).
const ZSTD_LEVEL: i32 = 3;

/// Bytes looked at to recognise a stream.
const MAGIC_LEN: usize = 6;

/// What the first bytes of a stream say.
fn recognise(head: &[u8]) -> Result<Compression, Refusal> {
    let starts = |magic: &[u8]| head.starts_with(magic);
    if starts(&[0x1f, 0x8b]) {
        Ok(Compression::Gzip)
    } else if starts(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Ok(Compression::Zstd)
    } else if starts(b"PK\x03\x04") || starts(b"PK\x05\x06") || starts(b"PK\x07\x08") {
        Err(Refusal::NotTar("this is a zip archive, not a tar"))
    } else if starts(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Err(Refusal::NotTar(
            "xz is not supported (only gzip and zstd are)",
        ))
    } else if starts(b"BZh") {
        Err(Refusal::NotTar(
            "bzip2 is not supported (only gzip and zstd are)",
        ))
    } else if starts(&[0x04, 0x22, 0x4d, 0x18]) {
        Err(Refusal::NotTar(
            "lz4 is not supported (only gzip and zstd are)",
        ))
    } else if starts(&[0x1f, 0x9d]) || starts(&[0x1f, 0xa0]) {
        Err(Refusal::NotTar(
            "compress (.Z) is not supported (only gzip and zstd are)",
        ))
    } else if starts(b"7z\xbc\xaf\x27\x1c") {
        Err(Refusal::NotTar("this is a 7z archive, not a tar"))
    } else if starts(b"Rar!") {
        Err(Refusal::NotTar("this is a rar archive, not a tar"))
    } else {
        Ok(Compression::None)
    }
}

/// Reads up to [`MAGIC_LEN`] bytes (fewer only at the end).
fn head_of(input: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut head = vec![0u8; MAGIC_LEN];
    let mut got = 0;
    while got < MAGIC_LEN {
        match input.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    head.truncate(got);
    Ok(head)
}

/// The input under a decoder: remembers whether it failed itself.
struct Source<R> {
    inner: R,
    failed: Rc<Cell<bool>>,
}

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|_| self.failed.set(true))
    }
}

/// Marks an error of a decoder (not of the stream under it).
#[derive(Debug)]
pub(crate) struct CorruptStream(pub &'static str);

impl std::fmt::Display for CorruptStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the {} stream is corrupt or truncated", self.0)
    }
}

impl std::error::Error for CorruptStream {}

/// A decompressed archive stream.
pub(crate) struct Decoded<'a> {
    inner: Box<dyn Read + 'a>,
    codec: Option<&'static str>,
    source_failed: Rc<Cell<bool>>,
}

impl std::fmt::Debug for Decoded<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoded")
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

impl Read for Decoded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inner.read(buf) {
            Ok(n) => Ok(n),
            Err(e) => match self.codec {
                Some(codec) if !self.source_failed.get() => {
                    tracing::debug!(codec, error = %e, "an imported stream does not decode");
                    Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        CorruptStream(codec),
                    ))
                }
                _ => Err(e),
            },
        }
    }
}

/// The refusal a read error of an import deserves: a corrupt stream, a
/// limit of the meter under the tar reader, or else a stream cut short.
pub(crate) fn read_refusal(e: &io::Error) -> Refusal {
    limit_refusal(e).unwrap_or_else(|| {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<CorruptStream>())
        {
            Some(CorruptStream(codec)) => Refusal::Corrupt(codec),
            None => Refusal::Truncated,
        }
    })
}

/// The limit (bytes or time) a read error of an import reports, if any.
pub(crate) fn limit_refusal(e: &io::Error) -> Option<Refusal> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<Exceeded>())
        .map(|Exceeded(r)| r.clone())
}

/// Recognises the compression of `input` and undoes it; a stream that is
/// something else than a tar, plain or compressed, is refused.
pub(crate) fn decode<'a>(mut input: impl Read + 'a) -> Result<Decoded<'a>, Refusal> {
    let head = head_of(&mut input).map_err(|_| Refusal::Truncated)?;
    let compression = recognise(&head)?;
    let failed = Rc::new(Cell::new(false));
    let source = Source {
        inner: io::Cursor::new(head).chain(input),
        failed: failed.clone(),
    };
    let (inner, codec): (Box<dyn Read + 'a>, _) = match compression {
        Compression::None => (Box::new(source), None),
        Compression::Gzip => (Box::new(MultiGzDecoder::new(source)), Some("gzip")),
        Compression::Zstd => {
            let decoder =
                zstd::stream::read::Decoder::new(source).map_err(|_| Refusal::Corrupt("zstd"))?;
            (Box::new(decoder), Some("zstd"))
        }
    };
    let mut decoded = Decoded {
        inner,
        codec,
        source_failed: failed,
    };
    if decoded.codec.is_none() {
        return Ok(decoded);
    }
    // What the compression held must be a tar, not a second compression.
    let inner_head = head_of(&mut decoded).map_err(|e| read_refusal(&e))?;
    match recognise(&inner_head) {
        Ok(Compression::None) => {}
        Ok(_) => {
            return Err(Refusal::NotTar(
                "not a tar archive (the stream is compressed twice)",
            ))
        }
        Err(r) => return Err(r),
    }
    let Decoded {
        inner,
        codec,
        source_failed,
    } = decoded;
    Ok(Decoded {
        inner: Box::new(io::Cursor::new(inner_head).chain(inner)),
        codec,
        source_failed,
    })
}

/// The compressing end of an export.
pub(crate) enum Encoder<W: Write> {
    /// No compression.
    Plain(W),
    /// gzip.
    Gzip(GzEncoder<W>),
    /// zstd.
    Zstd(zstd::stream::write::Encoder<'static, W>),
}

impl<W: Write> std::fmt::Debug for Encoder<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Plain(_) => "Encoder::Plain",
            Self::Gzip(_) => "Encoder::Gzip",
            Self::Zstd(_) => "Encoder::Zstd",
        })
    }
}

impl<W: Write> Encoder<W> {
    /// Compresses what is written into `out` as `compression` says.
    pub(crate) fn new(out: W, compression: Compression) -> io::Result<Self> {
        Ok(match compression {
            Compression::None => Self::Plain(out),
            Compression::Gzip => {
                Self::Gzip(GzEncoder::new(out, flate2::Compression::new(GZIP_LEVEL)))
            }
            Compression::Zstd => Self::Zstd(zstd::stream::write::Encoder::new(out, ZSTD_LEVEL)?),
        })
    }

    /// Writes the compressor's trailer and hands back the output.
    pub(crate) fn finish(self) -> io::Result<W> {
        match self {
            Self::Plain(w) => Ok(w),
            Self::Gzip(e) => e.finish(),
            Self::Zstd(e) => e.finish(),
        }
    }
}

impl<W: Write> Write for Encoder<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Plain(w) => w.write(buf),
            Self::Gzip(e) => e.write(buf),
            Self::Zstd(e) => e.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(w) => w.flush(),
            Self::Gzip(e) => e.flush(),
            Self::Zstd(e) => e.flush(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_formats_are_named() {
        let said = |head: &[u8]| match recognise(head) {
            Err(Refusal::NotTar(m)) => m.to_owned(),
            other => format!("{other:?}"),
        };
        assert_eq!(said(b"PK\x03\x04rest"), "this is a zip archive, not a tar");
        assert!(said(&[0xfd, b'7', b'z', b'X', b'Z', 0]).starts_with("xz is not supported"));
        assert!(said(b"BZh91AY").starts_with("bzip2 is not supported"));
        assert_eq!(recognise(&[0x1f, 0x8b, 8]), Ok(Compression::Gzip));
        assert_eq!(
            recognise(&[0x28, 0xb5, 0x2f, 0xfd, 0]),
            Ok(Compression::Zstd)
        );
        assert_eq!(recognise(b"notes.txt\0"), Ok(Compression::None));
    }

    #[test]
    fn a_gzip_of_a_gzip_is_refused_and_a_gzip_of_a_tar_decodes() {
        let gz = |data: &[u8]| {
            let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).unwrap();
            e.finish().unwrap()
        };
        let twice = gz(&gz(b"x"));
        assert!(matches!(decode(&twice[..]), Err(Refusal::NotTar(_))));
        let mut out = Vec::new();
        decode(&gz(&[7u8; 1000])[..])
            .unwrap()
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, vec![7u8; 1000]);
    }

    #[test]
    fn a_cut_gzip_is_a_decoder_error() {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&(0..100_000u32).map(|i| (i % 7) as u8).collect::<Vec<_>>())
            .unwrap();
        let full = e.finish().unwrap();
        let cut = &full[..full.len() - 4];
        let mut out = Vec::new();
        let err = decode(cut).unwrap().read_to_end(&mut out).unwrap_err();
        assert_eq!(read_refusal(&err), Refusal::Corrupt("gzip"));
    }
}
