//! The compression of workspace archives in HTTP terms: what an export's
//! `Accept-Encoding` asks for, and which `Content-Encoding` and
//! `Content-Type` of an upload the import refuses before reading it.

use axum::extract::Request;
use axum::http::header;
use dormouse_protocol::api::ErrorCode;
use dormouse_protocol::workspace::Compression;

use crate::error::HttpError;

/// The compression an `Accept-Encoding` asks for: zstd before gzip, none
/// when neither is named with a weight above zero.
pub(super) fn accepted_encoding(request: &Request) -> Compression {
    let Some(value) = request
        .headers()
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
    else {
        return Compression::None;
    };
    let accepted: Vec<Compression> = value
        .split(',')
        .filter_map(|item| {
            let mut parts = item.split(';');
            let name = parts.next()?.trim();
            let refused = parts.any(|p| {
                p.trim()
                    .strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            if refused || name == "identity" {
                return None;
            }
            Compression::parse(name).filter(|c| *c != Compression::None)
        })
        .collect();
    [Compression::Zstd, Compression::Gzip]
        .into_iter()
        .find(|c| accepted.contains(c))
        .unwrap_or(Compression::None)
}

/// Refuses, before reading it, an upload whose `Content-Encoding` or
/// `Content-Type` names a format the import cannot read. What the import
/// reads is then decided by the stream's own first bytes.
pub(super) fn check_upload_format(request: &Request) -> Result<(), HttpError> {
    let unsupported = |message: &str| HttpError::new(ErrorCode::UnsupportedMediaType, message);
    let text = |name| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
    };
    if let Some(encoding) = text(header::CONTENT_ENCODING) {
        for item in encoding.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if Compression::parse(item).is_none() {
                return Err(unsupported(&format!(
                    "content encoding {:?} is not supported (only gzip and zstd are)",
                    item.chars().take(32).collect::<String>()
                )));
            }
        }
    }
    if let Some(kind) = text(header::CONTENT_TYPE) {
        let kind = kind.split(';').next().unwrap_or("").trim().to_owned();
        match kind.as_str() {
            "application/zip" | "application/x-zip-compressed" => {
                return Err(unsupported("this is a zip archive, not a tar"))
            }
            "application/x-xz" => {
                return Err(unsupported("xz is not supported (only gzip and zstd are)"))
            }
            "application/x-bzip2" => {
                return Err(unsupported(
                    "bzip2 is not supported (only gzip and zstd are)",
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    #[test]
    fn accept_encoding_prefers_zstd_and_honours_zero_weights() {
        let with = |v: &str| {
            let r = Request::builder()
                .header(header::ACCEPT_ENCODING, v)
                .body(Body::empty())
                .unwrap();
            accepted_encoding(&r)
        };
        assert_eq!(with("gzip, deflate, br, zstd"), Compression::Zstd);
        assert_eq!(with("gzip"), Compression::Gzip);
        assert_eq!(with("zstd;q=0, gzip;q=0.5"), Compression::Gzip);
        assert_eq!(with("br, identity"), Compression::None);
    }

    #[test]
    fn uploads_in_formats_the_import_cannot_read_are_refused_first() {
        let with = |name, v: &str| {
            let r = Request::builder()
                .header(name, v)
                .body(Body::empty())
                .unwrap();
            check_upload_format(&r).map_err(|e| e.message().to_owned())
        };
        assert!(with(header::CONTENT_ENCODING, "gzip").is_ok());
        assert!(with(header::CONTENT_ENCODING, "zstd").is_ok());
        assert!(with(header::CONTENT_TYPE, "application/gzip").is_ok());
        assert!(with(header::CONTENT_ENCODING, "br")
            .unwrap_err()
            .contains("not supported"));
        assert_eq!(
            with(header::CONTENT_TYPE, "application/zip").unwrap_err(),
            "this is a zip archive, not a tar"
        );
        assert!(with(header::CONTENT_TYPE, "application/x-xz")
            .unwrap_err()
            .starts_with("xz is not supported"));
    }
}
