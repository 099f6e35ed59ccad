//! Following a desktop's changes on the event stream: until it is ready
//! (`create --wait`, `start --wait`), or for as long as it runs
//! (`status --watch`).

use std::io::Write;
use std::time::Duration;

use dormouse_client::{Client, EventStream};
use dormouse_protocol::api::{BrokerEvent, ComputerStatus, ContainerState};
use uuid::Uuid;

use crate::output::{container_word, print_json, progress_line};
use crate::{stdout, CliError};

/// Follows `status` until ready, printing each change of phase; fails when
/// the container stops or vanishes, or at the deadline.
pub(crate) async fn wait_ready(
    client: &Client,
    events: &mut EventStream,
    initial: ComputerStatus,
    timeout: Duration,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<ComputerStatus, CliError> {
    let id = initial.id;
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = initial;
    let mut shown = String::new();
    loop {
        let line = progress_line(&last);
        if line != shown && !json {
            writeln!(out, "  {line}").map_err(stdout)?;
            shown = line;
        }
        if last.ready {
            return Ok(last);
        }
        if matches!(
            last.container,
            ContainerState::Stopped | ContainerState::Missing
        ) {
            // The stream's first messages are a snapshot that may predate the
            // start; only a fresh read can say the start really failed.
            let fresh = client.get(id).await?;
            if !matches!(
                fresh.container,
                ContainerState::Stopped | ContainerState::Missing
            ) {
                last = fresh;
                continue;
            }
            let why = fresh
                .problem
                .clone()
                .or_else(|| fresh.resumable_problem.clone())
                .unwrap_or_else(|| format!("the container is {}", container_word(fresh.container)));
            return Err(CliError::Failed(format!(
                "{id} did not become ready: {why}"
            )));
        }
        let event = match tokio::time::timeout_at(deadline, events.next()).await {
            Err(_) => {
                return Err(CliError::Failed(format!(
                    "{id} not ready after {}: {}",
                    humantime::format_duration(timeout),
                    last.problem.as_deref().unwrap_or("no problem reported")
                )))
            }
            Ok(event) => event?,
        };
        match event {
            Some(BrokerEvent::Status { computer }) if computer.id == id => last = *computer,
            Some(BrokerEvent::Removed { id: gone }) if gone == id => {
                return Err(CliError::Failed(format!("{id} was removed while starting")));
            }
            Some(_) => {}
            None => {
                // The stream ended (broker restart); one last look.
                last = client.get(id).await?;
                if !last.ready {
                    return Err(CliError::Failed(
                        "event stream: the broker closed the event stream".into(),
                    ));
                }
            }
        }
    }
}

pub(crate) async fn watch_status(
    client: &Client,
    id: Uuid,
    json: bool,
    out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let mut events = client.events().await?;
    while let Some(event) = events.next().await? {
        match event {
            BrokerEvent::Status { computer } if computer.id == id => {
                if json {
                    print_json(out, &computer)?;
                } else {
                    writeln!(
                        out,
                        "{}  {}",
                        chrono::Local::now().format("%H:%M:%S"),
                        progress_line(&computer)
                    )
                    .map_err(stdout)?;
                }
                out.flush().map_err(stdout)?;
            }
            BrokerEvent::Removed { id: gone } if gone == id => {
                if json {
                    print_json(out, &BrokerEvent::Removed { id })?;
                } else {
                    writeln!(out, "removed").map_err(stdout)?;
                }
                return Ok(());
            }
            _ => {}
        }
    }
    Err(CliError::Failed(
        "event stream: the broker closed the event stream".into(),
    ))
}
