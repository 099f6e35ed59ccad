//! The streamable-HTTP transport (`/mcp` in the broker): a stateless
//! service whose every call reaches the broker's own API over its loopback
//! listener with the bearer token and `Dormouse-Generation` the MCP request
//! carried, and the options of its URL: `?desktop=` (pins the session to that
//! desktop: a call naming another is refused), `?screenshot=false`
//! (no screenshot after actions that change the screen), `?format=` and
//! `?quality=` (the encoding of the `computer` tool's images).
//!
//! The broker authenticates the request before it gets here; the token is
//! passed on, not trusted, so a tool can do exactly what the token can. The
//! `Host` header must be a loopback name and a browser's `Origin` a loopback
//! origin (DNS rebinding), rmcp's checks kept on.

use std::sync::Arc;

use dormouse_client::{Client, Endpoint};
use dormouse_protocol::api::GENERATION_HEADER;
use rmcp::model::Extensions;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use dormouse_protocol::image::ImageEncoding;

use crate::{Call, Dormouse, Settings, ToolError, UrlOptions};

/// The `/mcp` service: tools over `endpoint` (the broker's own listener).
pub fn service(
    endpoint: Endpoint,
    settings: Settings,
) -> StreamableHttpService<Dormouse, NeverSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_origins(["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]);
    let settings = Arc::new(settings);
    StreamableHttpService::new(
        move || {
            Ok(Dormouse::with_source(
                crate::Source::Loopback(endpoint.clone()),
                (*settings).clone(),
            ))
        },
        Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The call of one MCP request: a client with its bearer token and
/// generation, and what its URL says ([`url_options`]).
pub(crate) fn call_of(endpoint: &Endpoint, extensions: &Extensions) -> Result<Call, ToolError> {
    let parts = extensions
        .get::<http::request::Parts>()
        .ok_or(ToolError::NoToken)?;
    let token = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(ToolError::NoToken)?;
    let generation = match parts.headers.get(GENERATION_HEADER) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ToolError::Invalid(format!("{GENERATION_HEADER} must be a number"))
                })?,
        ),
    };
    let client = Client::builder(endpoint.clone())
        .token(token)
        .generation(generation)
        .user_agent(concat!("dormouse-mcp/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ToolError::Invalid(e.to_string()))?;
    let url = url_options(parts.uri.query().unwrap_or(""))?;
    Ok(Call { client, url })
}

/// The options of an `/mcp` URL's query: `desktop`, `screenshot`
/// (`true` or `false`), `format` and `quality` (as on `GET
/// …/screenshot`). Other parameters are left to the transport.
///
/// # Errors
/// A `screenshot` that is neither `true` nor `false`, or an encoding that
/// cannot be made; the call then runs nothing.
pub fn url_options(query: &str) -> Result<UrlOptions, ToolError> {
    let value = |key: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| percent_decode(v))
    };
    let screenshot_after = match value("screenshot").as_deref() {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(other) => {
            return Err(ToolError::Invalid(format!(
                "?screenshot={:?} in the MCP URL: use true or false",
                other.chars().take(64).collect::<String>()
            )))
        }
    };
    let (format, quality) = (value("format"), value("quality"));
    let encoding = match (&format, &quality) {
        (None, None) => None,
        _ => Some(
            ImageEncoding::parse(format.as_deref(), quality.as_deref())
                .map_err(|e| ToolError::Invalid(format!("the MCP URL's format: {e}")))?,
        ),
    };
    Ok(UrlOptions {
        desktop: value("desktop"),
        screenshot_after,
        encoding,
    })
}

/// `%XX` and `+` of a query value decoded (invalid escapes kept as they are).
fn percent_decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::{percent_decode, url_options};
    use crate::UrlOptions;
    use dormouse_protocol::image::{ImageEncoding, ImageFormat};

    #[test]
    fn url_options_parse_and_refuse() {
        assert_eq!(url_options("").unwrap(), UrlOptions::default());
        let all = url_options("desktop=my%20desk&screenshot=false&format=jpeg&quality=40").unwrap();
        assert_eq!(
            all,
            UrlOptions {
                desktop: Some("my desk".into()),
                screenshot_after: Some(false),
                encoding: Some(ImageEncoding {
                    format: ImageFormat::Jpeg,
                    quality: Some(40)
                }),
            }
        );
        assert_eq!(
            url_options("screenshot=true").unwrap().screenshot_after,
            Some(true)
        );
        let e = url_options("screenshot=no").unwrap_err().to_string();
        assert!(e.contains("use true or false"), "{e}");
        let e = url_options("format=gif").unwrap_err().to_string();
        assert!(e.contains("unknown image format \"gif\""), "{e}");
        let e = url_options("quality=50").unwrap_err().to_string();
        assert!(e.contains("not png"), "{e}");
    }

    #[test]
    fn query_values_decode() {
        assert_eq!(percent_decode("my%20desk"), "my desk");
        assert_eq!(percent_decode("a+b"), "a b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
