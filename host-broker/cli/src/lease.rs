//! `dormouse lease`: takes or renews the fencing lease of a desktop.

use std::io::Write;
use std::time::Duration;

use dormouse_client::Client;
use dormouse_protocol::api::{LeaseRequest, GENERATION_HEADER};

use crate::escape::Safe;
use crate::output::print_json;
use crate::{resolve, stdout, CliError};

/// Asks for the lease of `id` for `holder`, for `ttl`.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    holder: String,
    ttl: Duration,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    let request = LeaseRequest {
        holder,
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
    };
    let grant = client.lease(id, &request).await?;
    if json {
        print_json(out, &grant)
    } else {
        writeln!(
            out,
            "generation {} for {} until {} (send it as --generation {} or {GENERATION_HEADER})",
            grant.generation,
            Safe(&grant.holder),
            grant.expires_at.to_rfc3339(),
            grant.generation
        )
        .map_err(stdout)
    }
}
