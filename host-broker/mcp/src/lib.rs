//! `dormouse-mcp`: the Dormouse tools for MCP clients, one implementation
//! served two ways: over stdio by `dormouse mcp` (feature `stdio`) and over
//! streamable HTTP at the broker's `/mcp` (feature `http`).
//!
//! Every tool is a call of the broker's public API through
//! `dormouse-client`, so the tools are fenced, authenticated and refused
//! exactly as the API is: over stdio with the CLI's token and generation,
//! over HTTP with the bearer token and `Dormouse-Generation` the MCP request
//! itself carried (the broker's own loopback listener answers them). The
//! module owns the tool list and descriptions ([`tools`]), the `computer`
//! tool's schema and its mapping onto the action batch ([`computer`]), and
//! which desktop and coordinate space a call means. It never talks to the
//! guest or the engine.

pub mod computer;
#[cfg(feature = "http")]
pub mod http;
pub mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dormouse_client::Client;
use dormouse_protocol::actions::Scale;
use dormouse_protocol::image::ImageEncoding;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock, Extensions};
use uuid::Uuid;

/// The `computer` tool's default coordinate space: the largest size of the
/// screen's aspect within [`MAX_LONG_EDGE`] on its long edge and
/// [`MAX_PIXELS`] in all, the screenshot sizes the vendor's models use
/// without resizing them again.
pub const MAX_LONG_EDGE: u32 = 1568;
/// See [`MAX_LONG_EDGE`].
pub const MAX_PIXELS: u64 = 1_150_000;

/// How the server is set up (the same for every call it serves).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The desktop a tool means when the call names none.
    pub desktop: Option<String>,
    /// The `computer` tool's coordinate space (`--display WxH`); the
    /// default space ([`default_space`]) when `None`.
    pub display: Option<Scale>,
    /// Whether actions that change the screen answer a screenshot too.
    pub no_screenshot_after: bool,
    /// The encoding of the images the `computer` tool answers (PNG by
    /// default).
    pub encoding: ImageEncoding,
}

/// What the URL of one MCP request says (over HTTP: `?desktop=`,
/// `?screenshot=true|false`, `?format=`, `?quality=`), over the server's
/// [`Settings`]; empty over stdio.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UrlOptions {
    /// `?desktop=`: the desktop every tool call of the session means; a
    /// call naming another one is refused.
    pub desktop: Option<String>,
    /// `?screenshot=`: whether actions that change the screen answer a
    /// screenshot too.
    pub screenshot_after: Option<bool>,
    /// `?format=` and `?quality=`: the encoding of the tool's images.
    pub encoding: Option<ImageEncoding>,
}

/// One tool call's API client and what its URL says.
#[derive(Debug, Clone)]
struct Call {
    client: Client,
    url: UrlOptions,
}

/// Why a call could not be made: the API's refusal or a bad argument; the
/// tool answers it as a tool error.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The broker said no (its code and message), or could not be reached.
    #[error("{}", api_words(.0))]
    Api(#[from] dormouse_client::Error),
    /// The arguments do not fit the tool.
    #[error("{0}")]
    Invalid(String),
    /// The MCP request carried no bearer token (HTTP only).
    #[error("the request carries no bearer token")]
    NoToken,
    /// The call names a desktop other than the one the session's URL pins
    /// (`/mcp?desktop=`); nothing was done.
    #[error(
        "this MCP session is pinned to desktop {pinned:?} by ?desktop= in its URL: a call \
         naming desktop {named:?} is refused (leave `desktop` out, or open a session without \
         ?desktop= or with ?desktop= naming that one)"
    )]
    Pinned {
        /// The desktop of the URL, as given there (cut at 64 characters).
        pinned: String,
        /// The desktop the call named, as given (cut at 64 characters).
        named: String,
    },
}

/// The API's refusal as `code: message`; other failures with their causes.
fn api_words(e: &dormouse_client::Error) -> String {
    if let dormouse_client::Error::Api { code, message, .. } = e {
        return format!("{code}: {message}");
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl ToolError {
    /// The tool result of this error.
    pub fn into_result(self) -> CallToolResult {
        CallToolResult::error(vec![ContentBlock::text(self.to_string())])
    }
}

/// Where the API client of one call comes from.
#[derive(Debug, Clone)]
enum Source {
    /// A client set up once (stdio: the CLI's).
    Fixed(Client),
    /// The broker's own listener, with the token of each MCP request.
    #[cfg(feature = "http")]
    Loopback(dormouse_client::Endpoint),
}

/// The MCP server: its tools over one [`Source`] of API clients.
#[derive(Debug, Clone)]
pub struct Dormouse {
    source: Source,
    settings: Arc<Settings>,
    /// Screen sizes already learnt, for the default space.
    screens: Arc<Mutex<HashMap<Uuid, Scale>>>,
    tool_router: ToolRouter<Self>,
}

impl Dormouse {
    /// A server whose every call goes through `client`.
    pub fn over(client: Client, settings: Settings) -> Self {
        Self::with_source(Source::Fixed(client), settings)
    }

    fn with_source(source: Source, settings: Settings) -> Self {
        Self {
            source,
            settings: Arc::new(settings),
            screens: Arc::default(),
            tool_router: Self::tool_router(),
        }
    }

    /// The API client of a call and what its URL says.
    fn call(&self, extensions: &Extensions) -> Result<Call, ToolError> {
        let _ = extensions;
        match &self.source {
            Source::Fixed(client) => Ok(Call {
                client: client.clone(),
                url: UrlOptions::default(),
            }),
            #[cfg(feature = "http")]
            Source::Loopback(endpoint) => http::call_of(endpoint, extensions),
        }
    }

    /// The API client of a call and the desktop it means ([`Self::desktop`]).
    async fn target(
        &self,
        extensions: &Extensions,
        given: Option<&str>,
    ) -> Result<(Client, Uuid), ToolError> {
        let call = self.call(extensions)?;
        let id = self.desktop(&call, given).await?;
        Ok((call.client, id))
    }

    /// The desktop a call means, as an id or a name. A URL's `?desktop=`
    /// pins it: a `desktop` argument naming another one (by id or name) is
    /// refused ([`ToolError::Pinned`]). Otherwise the `desktop` argument,
    /// or the server's `--desktop`.
    async fn desktop(&self, call: &Call, given: Option<&str>) -> Result<Uuid, ToolError> {
        if let Some(pinned) = call.url.desktop.as_deref() {
            let id = resolve(&call.client, pinned).await?;
            if let Some(named) = given.filter(|named| *named != pinned) {
                // The same desktop by its other form (id or name) is fine;
                // one that does not resolve is not the pinned one either.
                if resolve(&call.client, named).await.ok() != Some(id) {
                    let cut = |s: &str| s.chars().take(64).collect::<String>();
                    return Err(ToolError::Pinned {
                        pinned: cut(pinned),
                        named: cut(named),
                    });
                }
            }
            return Ok(id);
        }
        let name = given
            .or(call.url.desktop.as_deref())
            .or(self.settings.desktop.as_deref())
            .ok_or_else(|| {
                ToolError::Invalid(
                    "no desktop: pass `desktop` (an id or a name; see the `desktops` tool)".into(),
                )
            })?;
        resolve(&call.client, name).await
    }

    /// The `computer` tool's space on desktop `id`.
    async fn space(&self, client: &Client, id: Uuid) -> Result<Scale, ToolError> {
        if let Some(display) = self.settings.display {
            return Ok(display);
        }
        if let Some(known) = self.screens.lock().ok().and_then(|m| m.get(&id).copied()) {
            return Ok(known);
        }
        let png = client.screenshot(id).await?;
        let screen = png_size(&png)
            .ok_or_else(|| ToolError::Invalid("the screenshot is not a PNG".into()))?;
        let space = default_space(screen);
        if let Ok(mut m) = self.screens.lock() {
            m.insert(id, space);
        }
        Ok(space)
    }
}

/// Serves the tools over stdin and stdout until the client closes them.
#[cfg(feature = "stdio")]
pub async fn serve_stdio(server: Dormouse) -> Result<(), std::io::Error> {
    use rmcp::ServiceExt as _;
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(std::io::Error::other)?;
    running.waiting().await.map_err(std::io::Error::other)?;
    Ok(())
}

/// The default space on a `screen`: its aspect, within [`MAX_LONG_EDGE`]
/// and [`MAX_PIXELS`], never larger than the screen.
pub fn default_space(screen: Scale) -> Scale {
    let (w, h) = (f64::from(screen.width), f64::from(screen.height));
    let long = w.max(h).max(1.0);
    let pixels = (w * h).max(1.0);
    #[allow(clippy::cast_precision_loss)]
    let by_area = (MAX_PIXELS as f64 / pixels).sqrt();
    let f = (f64::from(MAX_LONG_EDGE) / long).min(by_area).min(1.0);
    let side = |v: f64| {
        let v = (v * f).floor().clamp(1.0, f64::from(u32::MAX));
        // Within 1..=u32::MAX by the clamp.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let v = v as u32;
        v
    };
    Scale {
        width: side(w),
        height: side(h),
    }
}

/// The width and height in a PNG's header.
pub fn png_size(png: &[u8]) -> Option<Scale> {
    if png.get(..8)? != b"\x89PNG\r\n\x1a\n" || png.get(12..16)? != b"IHDR" {
        return None;
    }
    let be = |r: std::ops::Range<usize>| -> Option<u32> {
        Some(u32::from_be_bytes(png.get(r)?.try_into().ok()?))
    };
    Some(Scale {
        width: be(16..20)?,
        height: be(20..24)?,
    })
}

/// A desktop by id or name (a name must match exactly one).
pub async fn resolve(client: &Client, given: &str) -> Result<Uuid, ToolError> {
    if let Ok(id) = Uuid::try_parse(given) {
        return Ok(id);
    }
    let list = client.list().await?;
    let mut found = list.iter().filter(|c| c.name == given).map(|c| c.id);
    match (found.next(), found.next()) {
        (Some(id), None) => Ok(id),
        (None, _) => Err(ToolError::Invalid(format!(
            "no desktop is named {given:?} (see the `desktops` tool)"
        ))),
        (Some(_), Some(_)) => Err(ToolError::Invalid(format!(
            "several desktops are named {given:?}; pass its id"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_space_keeps_the_vendor_limits() {
        let s = |width, height| Scale { width, height };
        assert_eq!(default_space(s(1280, 800)), s(1280, 800));
        assert_eq!(default_space(s(1024, 768)), s(1024, 768));
        let big = default_space(s(2560, 1600));
        assert!(big.width <= MAX_LONG_EDGE);
        assert!(u64::from(big.width) * u64::from(big.height) <= MAX_PIXELS);
        assert_eq!(big, s(1356, 847));
        let wide = default_space(s(3840, 1080));
        assert_eq!(wide.width, 1568);
    }

    fn pinned_to(desktop: Option<String>) -> (Dormouse, Call) {
        // Nobody listens there: a call that would need the broker fails.
        let endpoint: dormouse_client::Endpoint = "http://127.0.0.1:9".parse().unwrap();
        let client = Client::builder(endpoint).token("t").build().unwrap();
        let server = Dormouse::over(client.clone(), Settings::default());
        let url = UrlOptions {
            desktop,
            ..UrlOptions::default()
        };
        (server, Call { client, url })
    }

    #[tokio::test]
    async fn a_pinned_session_refuses_another_desktop_with_the_reason() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let (server, call) = pinned_to(Some(a.to_string()));
        // Without an argument, or naming the pinned one: the pinned one.
        assert_eq!(server.desktop(&call, None).await.unwrap(), a);
        let same = a.to_string();
        assert_eq!(server.desktop(&call, Some(&same)).await.unwrap(), a);
        assert_eq!(
            server
                .desktop(&call, Some(&a.hyphenated().to_string().to_uppercase()))
                .await
                .unwrap(),
            a,
            "the same id in another spelling"
        );
        // Another id: refused, saying why.
        let other = b.to_string();
        let e = server.desktop(&call, Some(&other)).await.unwrap_err();
        assert!(matches!(e, ToolError::Pinned { .. }), "{e:?}");
        let words = e.to_string();
        assert!(
            words.contains("pinned to desktop")
                && words.contains(&a.to_string())
                && words.contains(&other)
                && words.contains("?desktop="),
            "{words}"
        );
        // A name that cannot be looked up (no broker here) is not the
        // pinned desktop either: refused, not silently taken.
        let e = server.desktop(&call, Some("elsewhere")).await.unwrap_err();
        assert!(matches!(e, ToolError::Pinned { .. }), "{e:?}");
        // As a tool result: an error the client sees, with the reason.
        let result = e.into_result();
        assert_eq!(result.is_error, Some(true));

        // Unpinned: the argument chooses, as before.
        let (server, call) = pinned_to(None);
        assert_eq!(server.desktop(&call, Some(&other)).await.unwrap(), b);
        assert!(matches!(
            server.desktop(&call, None).await.unwrap_err(),
            ToolError::Invalid(_)
        ));
    }

    #[test]
    fn png_headers_are_read() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend_from_slice(&1024u32.to_be_bytes());
        png.extend_from_slice(&640u32.to_be_bytes());
        assert_eq!(
            png_size(&png),
            Some(Scale {
                width: 1024,
                height: 640
            })
        );
        assert_eq!(png_size(b"GIF89a"), None);
    }
}
