//! `dormouse start`: resumes a stopped desktop, optionally until ready.

use std::io::Write;
use std::time::{Duration, Instant};

use dormouse_client::Client;

use crate::output::{print_json, print_status};
use crate::wait::wait_ready;
use crate::{resolve, stdout, CliError};

/// Starts `id`; with `wait`, follows it until ready within that long.
pub(crate) async fn run(
    client: &Client,
    id: &str,
    wait: Option<Duration>,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let id = resolve(client, id).await?;
    // Subscribe before asking, so no change between the two is missed.
    let mut events = match wait {
        Some(_) => Some(client.events().await?),
        None => None,
    };
    let started = Instant::now();
    let status = client.start(id).await?;
    match (events.as_mut(), wait) {
        (Some(events), Some(timeout)) => {
            let status = wait_ready(client, events, status, timeout, json, out).await?;
            if !json {
                writeln!(out, "ready after {:.2} s", started.elapsed().as_secs_f64())
                    .map_err(stdout)?;
            }
            if json {
                print_json(out, &status)?;
            }
            Ok(())
        }
        _ => print_status(out, &status, json),
    }
}
