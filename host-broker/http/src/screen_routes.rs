//! The HTTP side of the screen contract.
//!
//! - `POST /v1/computers/{id}/screens` (bearer token; `Dormouse-Generation`
//!   for control under a live lease) mints a capability: `201` with its
//!   token, shown this once;
//! - `GET /v1/computers/{id}/screens` (bearer token) lists live ones;
//! - `DELETE /v1/screens/{screen_id}` (bearer token) revokes one;
//! - `GET /v1/screens/{screen_id}/rfb` (WebSocket; **only** the screen
//!   token, as subprotocol `dormouse.screen.<token>` beside `binary`, or as
//!   `?token=`) carries RFB.
//!
//! It parses and answers; admission is the [`ScreenHost`](crate::screen::ScreenHost)'s,
//! bytes are the [`relay`](crate::screen::relay)'s. It must never log a token or a
//! query string, and never accept the broker's bearer token on the RFB route
//! (a leaked screen link must not be worth more than one screen).

use axum::body::Bytes;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocketUpgrade};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Json, Router};
use dormouse_protocol::api::ErrorCode;
use dormouse_protocol::screen::{
    CreateScreen, ScreenMode, CLOSE_SCREEN_FULL, DEFAULT_SCREEN_TTL_MS, RFB_SUBPROTOCOL,
    SCREEN_SUBPROTOCOL_PREFIX,
};
use uuid::Uuid;

use crate::extract::parse_generation;
use crate::screen::relay::{relay, RelaySession};
use crate::screen::{Mint, RegistryError};
use crate::screen::{Refusal, ScreenGateway};
use crate::HttpError;
use dormouse_core::command::Fence;
use dormouse_core::faults;

/// Path of the mint and list routes.
pub const SCREENS_PATH: &str = "/v1/computers/{id}/screens";
/// Path of the revoke route.
pub const SCREEN_PATH: &str = "/v1/screens/{screen_id}";
/// Path of the RFB WebSocket (public: the screen token is its credential).
pub const RFB_PATH: &str = "/v1/screens/{screen_id}/rfb";

impl From<Refusal> for HttpError {
    fn from(r: Refusal) -> Self {
        HttpError::new(r.code, r.message)
    }
}

impl From<RegistryError> for HttpError {
    fn from(e: RegistryError) -> Self {
        let code = match e {
            RegistryError::BadTtl => ErrorCode::BadRequest,
            RegistryError::TooManyScreens(_) => ErrorCode::TooManyScreens,
            RegistryError::NotFound => ErrorCode::NotFound,
            RegistryError::BadToken => ErrorCode::InvalidScreenToken,
            RegistryError::Raced => ErrorCode::StateChanged,
            RegistryError::TooManyConnections | RegistryError::ScreenFull(_) => {
                ErrorCode::TooManyConnections
            }
        };
        HttpError::new(code, e.to_string())
    }
}

/// The screen routes on their own, bearer checks left to the caller's
/// router (the broker mounts them in its route table; tests use this).
pub fn router(gateway: ScreenGateway) -> Router {
    Router::new()
        .route(SCREENS_PATH, get(list).post(create))
        .route(SCREEN_PATH, delete(revoke))
        .route(RFB_PATH, get(rfb))
        .with_state(gateway)
}

fn parse_id(raw: &str, what: &str) -> Result<Uuid, HttpError> {
    Uuid::parse_str(raw).map_err(|_| HttpError::bad_request(format!("{what} is not a UUID")))
}

/// `POST /v1/computers/{id}/screens`.
pub async fn create(
    State(gw): State<ScreenGateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, HttpError> {
    let computer = parse_id(&id, "the computer id")?;
    let fence = parse_generation(&headers)?;
    let request: CreateScreen = serde_json::from_slice(&body)
        .map_err(|e| HttpError::bad_request(format!("invalid screen request: {e}")))?;
    request
        .validate()
        .map_err(|e| HttpError::bad_request(format!("invalid screen request: {e}")))?;
    let ttl_ms = request.ttl_ms.unwrap_or(DEFAULT_SCREEN_TTL_MS);
    faults::within(
        faults::op::SCREEN_MINT,
        mint(gw, computer, fence, request, ttl_ms),
    )
    .await
}

/// Admits and mints one capability (the body of [`create`]).
async fn mint(
    gw: ScreenGateway,
    computer: Uuid,
    fence: Fence,
    request: CreateScreen,
    ttl_ms: u64,
) -> Result<Response, HttpError> {
    // A revocation between admission and mint (another capability's, a
    // generation change) refuses the mint; admit again a few times before
    // answering `state_changed`, so a view is not failed by a lease change.
    let mut attempts = 0;
    let grant = loop {
        attempts += 1;
        let epoch = gw.registry.epoch(computer);
        let (current, actor) = gw.host.admit_as(computer, request.mode, fence).await?;
        faults::step("screen: admitted");
        let mint = Mint {
            mode: request.mode,
            ttl_ms,
            generation: current,
            epoch,
            reason: request.reason.as_deref(),
        };
        match gw.registry.mint_as(computer, mint, actor) {
            Err(RegistryError::Raced) if attempts < 3 => continue,
            other => break other?,
        }
    };
    faults::step("screen: minted");
    tracing::info!(
        computer = %computer,
        screen = %grant.screen_id,
        mode = grant.mode.as_str(),
        ttl_ms,
        reason = request.reason.as_deref().unwrap_or(""),
        "screen capability minted"
    );
    Ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, "no-store")],
        Json(grant),
    )
        .into_response())
}

/// `GET /v1/computers/{id}/screens`.
pub async fn list(
    State(gw): State<ScreenGateway>,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let computer = parse_id(&id, "the computer id")?;
    gw.host.exists(computer).await?;
    Ok(Json(gw.registry.list(computer)).into_response())
}

/// `DELETE /v1/screens/{screen_id}`: `204`, or `404` when it is not live.
pub async fn revoke(
    State(gw): State<ScreenGateway>,
    Path(id): Path<String>,
) -> Result<Response, HttpError> {
    let screen_id = parse_id(&id, "the screen id")?;
    gw.registry
        .revoke(screen_id, dormouse_protocol::screen::RevokeReason::Deleted)?;
    tracing::info!(screen = %screen_id, "screen capability revoked by request");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The screen token of a request: `dormouse.screen.<token>` among the
/// offered subprotocols, else `?token=`.
pub(crate) fn screen_token(headers: &HeaderMap, query: Option<&str>) -> Option<String> {
    let from_protocol = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| p.strip_prefix(SCREEN_SUBPROTOCOL_PREFIX))
        .filter(|t| crate::auth::is_subprotocol_token(t))
        .map(str::to_owned);
    from_protocol.or_else(|| crate::auth::token_from_query(query))
}

fn token_required() -> HttpError {
    HttpError::new(
        ErrorCode::ScreenTokenRequired,
        "this route takes a screen token (subprotocol dormouse.screen.<token> or ?token=); \
         the broker's bearer token is not accepted here",
    )
}

/// `GET /v1/screens/{screen_id}/rfb`: the RFB WebSocket.
pub async fn rfb(
    State(gw): State<ScreenGateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, HttpError> {
    let screen_id = parse_id(&id, "the screen id")?;
    let token = screen_token(&headers, query.as_deref()).ok_or_else(token_required)?;
    let ticket = match gw.registry.authorize(screen_id, &token) {
        // A viewer in a browser cannot read an HTTP answer to its upgrade:
        // the screen being full is said in a close frame it can show.
        Err(full @ RegistryError::ScreenFull(_)) if upgrade.is_ok() => {
            tracing::info!(screen = %screen_id, reason = %full, "screen connection refused");
            return Ok(close_at_once(upgrade, CLOSE_SCREEN_FULL, full.to_string()));
        }
        other => other?,
    };
    drop(token);
    let upgrade = upgrade.map_err(|rejection| {
        HttpError::with_status(
            rejection.status(),
            ErrorCode::WebsocketRequired,
            format!("this route is a WebSocket: {rejection}"),
        )
    })?;
    // Connect before upgrading, so a desktop without a screen is an HTTP
    // error the client can read, not an opened-then-closed socket.
    let vnc = gw.host.connect_vnc(ticket.computer).await?;
    let limits = gw.limits;
    let session = RelaySession {
        mode: ticket.mode,
        deadline: ticket.deadline,
        revoked: ticket.revoked,
        shutdown: gw.shutdown.clone(),
    };
    let (computer, mode) = (ticket.computer, ticket.mode);
    Ok(upgrade
        .protocols([RFB_SUBPROTOCOL])
        .max_message_size(limits.max_client_message)
        .max_frame_size(limits.max_client_message)
        .write_buffer_size(limits.read_chunk)
        .max_write_buffer_size(limits.read_chunk.saturating_mul(4).max(1 << 20))
        .on_upgrade(move |socket| async move {
            tracing::info!(computer = %computer, screen = %screen_id, mode = mode.as_str(), "screen connection opened");
            let (end, stats) = relay(socket, vnc, session, limits).await;
            tracing::info!(
                computer = %computer,
                screen = %screen_id,
                mode = mode.as_str(),
                end = ?end,
                to_viewer = stats.to_viewer,
                to_desktop = stats.to_desktop,
                dropped_input = stats.dropped_input,
                dropped_cut_text = stats.dropped_cut_text,
                "screen connection closed"
            );
            if mode == ScreenMode::View && stats.dropped_input > 0 {
                tracing::debug!(screen = %screen_id, "a view connection's input was dropped");
            }
        }))
}

/// Accepts the upgrade only to close it at once with `code` and `reason`.
fn close_at_once(
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
    code: u16,
    reason: String,
) -> Response {
    let Ok(upgrade) = upgrade else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    upgrade
        .protocols([RFB_SUBPROTOCOL])
        .on_upgrade(move |mut socket| async move {
            let frame = CloseFrame {
                code,
                reason: reason.into(),
            };
            let close = socket.send(Message::Close(Some(frame)));
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), close).await;
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use dormouse_protocol::api::GENERATION_HEADER;

    #[test]
    fn the_screen_token_comes_from_the_subprotocol_or_the_query_only() {
        let mut h = HeaderMap::new();
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("binary, dormouse.screen.abc"),
        );
        assert_eq!(screen_token(&h, Some("token=zzz")).as_deref(), Some("abc"));
        let mut bearer = HeaderMap::new();
        bearer.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("binary, dormouse.bearer.abc"),
        );
        bearer.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(screen_token(&bearer, None), None);
        assert_eq!(
            screen_token(&HeaderMap::new(), Some("a=1&token=t")).as_deref(),
            Some("t")
        );
        assert_eq!(screen_token(&HeaderMap::new(), Some("token=")), None);
    }

    #[test]
    fn the_generation_header_is_strict() {
        let mut h = HeaderMap::new();
        assert_eq!(parse_generation(&h).unwrap(), None);
        h.insert(GENERATION_HEADER, HeaderValue::from_static("12"));
        assert_eq!(parse_generation(&h).unwrap(), Some(12));
        h.append(GENERATION_HEADER, HeaderValue::from_static("12"));
        assert!(parse_generation(&h).is_err());
        for bad in ["-1", "+5", "", "1 2", "0x1"] {
            let mut h = HeaderMap::new();
            h.insert(GENERATION_HEADER, HeaderValue::from_static(bad));
            assert!(parse_generation(&h).is_err(), "{bad:?} accepted");
        }
    }
}
