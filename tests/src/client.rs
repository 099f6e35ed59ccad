//! Test glue over `dormouse-client`: waiting until a computer's status
//! satisfies a condition (pushed events first, a slow GET as a safety net),
//! and event streams that print a timeline for harnesses.
//!
//! It speaks no HTTP of its own: every request goes through
//! [`dormouse_client::Client`]. It never reads the broker's data directory
//! or asks the engine: what it reports is what a frontend sees.

use std::time::Duration;

use dormouse_client::{Client, EventsError};
use dormouse_protocol::api::{BrokerEvent, ComputerStatus, ContainerState};
use tokio::time::Instant;
use uuid::Uuid;

pub use dormouse_client::{Client as ApiClient, Error as ClientError, StatusCode};

/// How often [`Waits::wait_for`] also asks with a GET, in case an event was
/// lost (a lagging subscriber, a broker restart).
const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// Why a wait ended without the awaited status.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The broker stopped answering (or refused) the GET.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The wait ran out of time.
    #[error("timed out after {waited:?} waiting until {what}; last status seen: {last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// The last status seen, as JSON, for the failure message.
        last: String,
    },
}

/// A status that satisfied a wait, and how it was learnt.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The status.
    pub status: ComputerStatus,
    /// When it arrived.
    pub at: Instant,
    /// `true` when it was pushed on `/v1/events`, `false` when a fallback
    /// GET found it.
    pub pushed: bool,
}

/// The `/v1/events` stream of a test, optionally traced to stderr.
#[derive(Debug)]
pub struct EventStream {
    stream: dormouse_client::EventStream,
    /// When set, every event is printed to stderr with the time since this
    /// instant (for harnesses that need a timeline).
    trace: Option<Instant>,
}

impl EventStream {
    /// Opens `/v1/events` of `api`'s broker.
    pub async fn open(api: &Client) -> Result<Self, ClientError> {
        Ok(Self {
            stream: api.events().await?,
            trace: None,
        })
    }

    /// Prints every event received from now on to stderr, stamped with the
    /// milliseconds since `epoch`.
    pub fn trace_since(&mut self, epoch: Instant) {
        self.trace = Some(epoch);
    }

    /// Drops every event that has already arrived, without waiting.
    fn discard_buffered(&mut self) {
        loop {
            match self.stream.next_buffered() {
                Ok(Some(event)) => self.note("(history)", &event),
                Ok(None) => return,
                // A broken stream is closed; the GETs carry on.
                Err(_) => {
                    self.stream.close();
                    return;
                }
            }
        }
    }

    /// The next event; `Ok(None)` once the stream has ended.
    async fn next_event(&mut self) -> Result<Option<BrokerEvent>, EventsError> {
        let event = self.stream.next().await?;
        if let Some(event) = &event {
            self.note("event", event);
        }
        Ok(event)
    }

    fn note(&self, what: &str, event: &BrokerEvent) {
        if let Some(epoch) = self.trace {
            eprintln!(
                "  {:>7} ms  {what} {}",
                epoch.elapsed().as_millis(),
                summarize(event)
            );
        }
    }
}

/// Waiting for states, on top of the client's calls.
#[allow(async_fn_in_trait)]
pub trait Waits {
    /// Waits until `pred` holds for computer `id`: first by a GET (the
    /// state may already hold), then on pushed events, with a slow GET as a
    /// safety net. A broken event stream degrades to the GET alone; a broker
    /// that stops answering GETs ends the wait with that error.
    async fn wait_for(
        &self,
        events: &mut EventStream,
        id: Uuid,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&ComputerStatus) -> bool,
    ) -> Result<Seen, WaitError>;

    /// Waits until the desktop is running and its self-probe passed.
    async fn wait_ready(
        &self,
        events: &mut EventStream,
        id: Uuid,
        timeout: Duration,
    ) -> Result<Seen, WaitError> {
        self.wait_for(events, id, "ready", timeout, is_ready).await
    }

    /// Waits until the engine reports the container stopped.
    async fn wait_stopped(
        &self,
        events: &mut EventStream,
        id: Uuid,
        timeout: Duration,
    ) -> Result<Seen, WaitError> {
        self.wait_for(events, id, "the container is stopped", timeout, |s| {
            s.container == ContainerState::Stopped
        })
        .await
    }
}

impl Waits for Client {
    async fn wait_for(
        &self,
        events: &mut EventStream,
        id: Uuid,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&ComputerStatus) -> bool,
    ) -> Result<Seen, WaitError> {
        let started = Instant::now();
        let deadline = started + timeout;
        // Events already delivered are history: the GET answers with the
        // state now, and anything pushed before that answer is older than it
        // (on loopback the push is in our socket before the GET's answer).
        events.discard_buffered();
        let now = self.get(id).await?;
        events.discard_buffered();
        if pred(&now) {
            return Ok(Seen {
                status: now,
                at: Instant::now(),
                pushed: false,
            });
        }
        let mut last = Some(now);
        let mut poll = tokio::time::interval_at(started + FALLBACK_POLL, FALLBACK_POLL);
        loop {
            tokio::select! {
                event = events.next_event(), if events.stream.is_open() => match event {
                    Ok(Some(BrokerEvent::Status { computer })) if computer.id == id => {
                        if pred(&computer) {
                            return Ok(Seen { status: *computer, at: Instant::now(), pushed: true });
                        }
                        last = Some(*computer);
                    }
                    Ok(Some(_)) => {}
                    // The GET below keeps the wait going without events.
                    Ok(None) | Err(_) => events.stream.close(),
                },
                _ = poll.tick() => {
                    let status = self.get(id).await?;
                    if pred(&status) {
                        return Ok(Seen { status, at: Instant::now(), pushed: false });
                    }
                    last = Some(status);
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(WaitError::Timeout {
                        what: what.to_owned(),
                        waited: started.elapsed(),
                        last: last
                            .map(|s| serde_json::to_string(&s).unwrap_or_default())
                            .unwrap_or_else(|| "none".to_owned()),
                    });
                }
            }
        }
    }
}

/// Running and ready: what a frontend may hand to a user.
pub fn is_ready(status: &ComputerStatus) -> bool {
    status.container == ContainerState::Running && status.ready
}

/// One line about an event, for traces.
pub fn summarize(event: &BrokerEvent) -> String {
    match event {
        BrokerEvent::Status { computer: c } => format!(
            "status {} container={:?} ready={} phase={:?} stop_reason={:?} resumable={} {}",
            c.id,
            c.container,
            c.ready,
            c.phase,
            c.stop_reason,
            c.resumable,
            c.resumable_problem.as_deref().unwrap_or("")
        ),
        BrokerEvent::Removed { id } => format!("removed {id}"),
        BrokerEvent::Activity { id, entry } => {
            format!(
                "activity {id} #{} {} {}",
                entry.seq, entry.actor, entry.summary
            )
        }
        BrokerEvent::Egress { entry } => format!(
            "egress {} {}:{} {} {}",
            entry.computer,
            entry.host,
            entry.port,
            entry.decision.as_str(),
            entry.reason.as_deref().unwrap_or("")
        ),
    }
}

/// Creates a desktop named `name` and waits until it is ready (events on
/// `events`, opened before the create so its readiness cannot be missed).
pub async fn create_ready(
    api: &Client,
    events: &mut EventStream,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<Uuid> {
    let created = api
        .create(&dormouse_protocol::api::CreateComputer {
            name: Some(name.to_owned()),
            ..Default::default()
        })
        .await?;
    api.wait_ready(events, created.id, timeout).await?;
    Ok(created.id)
}

/// `POST start`, retried while the broker still settles the last stop (409
/// "… in progress" for a short while is fair; forever is not). Any other
/// refusal is an answer.
pub async fn start_retrying(api: &Client, id: Uuid) -> anyhow::Result<ComputerStatus> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match api.start(id).await {
            Ok(status) => return Ok(status),
            Err(ClientError::Api {
                status, message, ..
            }) if status == StatusCode::CONFLICT
                && message.contains("in progress")
                && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
