//! `dormouse create`: a new desktop, optionally followed until ready.

use std::io::Write;
use std::time::Duration;

use dormouse_client::Client;
use dormouse_protocol::api::CreateComputer;

use crate::escape::Safe;
use crate::output::print_status;
use crate::wait::wait_ready;
use crate::{stdout, CliError};

/// Creates a desktop; with `wait`, follows it until ready within that long.
pub(crate) async fn run(
    client: &Client,
    name: Option<String>,
    owner: Option<String>,
    wait: Option<Duration>,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let request = CreateComputer {
        name,
        owner,
        workspace_from: None,
        egress: None,
    };
    let mut events = match wait {
        Some(_) => Some(client.events().await?),
        None => None,
    };
    let status = client.create(&request).await?;
    match (events.as_mut(), wait) {
        (Some(events), Some(timeout)) => {
            if !json {
                writeln!(out, "created {} ({})", status.id, Safe(&status.name)).map_err(stdout)?;
            }
            let status = wait_ready(client, events, status, timeout, json, out).await?;
            print_status(out, &status, json)
        }
        _ => print_status(out, &status, json),
    }
}
