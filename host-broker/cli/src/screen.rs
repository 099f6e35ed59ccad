//! `dormouse screen ID [--control] [--ttl 10m]`: mints a screen capability
//! and prints the link a person opens (the panel's viewer page, with the
//! capability in the URL's fragment, which the browser never sends to a
//! server). It never opens the screen itself and never logs the token.

use std::io::Write;
use std::time::Duration;

use dormouse_client::{Client, Endpoint};
use dormouse_protocol::screen::{viewer_link, CreateScreen, ScreenMode};

use super::{print_json, resolve, stdout, CliError};

/// Runs the subcommand.
pub async fn screen(
    client: &Client,
    id: &str,
    control: bool,
    ttl: Duration,
    reason: Option<String>,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let request = CreateScreen {
        mode: if control {
            ScreenMode::Control
        } else {
            ScreenMode::View
        },
        ttl_ms: Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
        reason,
    };
    let grant = client.create_screen(id, &request).await?;
    let link = viewer_link(&grant);
    let url = match client.endpoint() {
        Endpoint::Http { base } => format!("{base}{link}"),
        // A browser cannot open a unix socket: the path, for the broker's
        // HTTP address in front of it.
        Endpoint::Unix(_) => link,
    };
    if json {
        return print_json(
            out,
            &serde_json::json!({
                "url": url,
                "screen_id": grant.screen_id,
                "mode": grant.mode,
                "expires_at": grant.expires_at,
                "websocket": grant.websocket,
            }),
        );
    }
    writeln!(out, "{url}").map_err(stdout)?;
    writeln!(
        out,
        "{} screen until {} (revoke: DELETE /v1/screens/{})",
        grant.mode.as_str(),
        grant.expires_at.to_rfc3339(),
        grant.screen_id
    )
    .map_err(stdout)
}
