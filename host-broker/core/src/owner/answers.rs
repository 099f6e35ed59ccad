//! Whether the guest answers the calls made to it, beside what its status
//! stream says.
//!
//! The stream is one connection opened when the container started; a guest
//! that replaces its sockets afterwards (with links, with something that is
//! not a socket) or stops accepting keeps that stream going while every new
//! call fails. So every call relayed to the guest ([`crate::relay`]) tells
//! the owner whether the guest's channel answered it. The first failure
//! makes the status not ready and `degraded`, with the reason, and starts a
//! probe that greets the guest on a fresh connection, on a backoff, until
//! it answers; that (or any call answered meanwhile, or the follower
//! greeting the guest anew) makes it ready again.
//!
//! It never decides anything about the container itself: a channel that
//! fails because the desktop stopped is the witness's business
//! ([`super::follow`]), and the probe ends with the follower.

use std::time::Duration;

use uuid::Uuid;

use super::computer::Computer;
use super::follow::without_paths;
use super::ops::OpKind;
use super::{Internal, Owner};
use crate::command::AnswerReport;
use crate::guest::{self, GuestSocket};

/// The probe's first pause after a failed call.
const PROBE_FIRST: Duration = Duration::from_millis(250);
/// Its longest pause between greetings.
const PROBE_MAX: Duration = Duration::from_secs(5);

/// Clears a call problem once the guest answered (dropping its probe).
/// Whether anything changed.
pub(super) fn answered_again(c: &mut Computer) -> bool {
    if let Some(probe) = c.guest.probe.take() {
        probe.abort();
    }
    c.guest.calls.take().is_some()
}

impl Owner {
    /// The report the calls of a ticket for `id` make, under its current
    /// follower's `epoch` (none: a desktop not followed, whose calls'
    /// outcomes say nothing the owner acts on).
    pub(super) fn answer_report(&self, id: Uuid, epoch: Option<u64>) -> AnswerReport {
        let Some(epoch) = epoch else {
            return AnswerReport::default();
        };
        let tx = self.internal.clone();
        AnswerReport::new(move |problem| {
            // Never blocks a call; a report lost to a full queue is made
            // good by the next call, the probe, or the follower.
            let _ = tx.try_send(Internal::CallAnswered { id, epoch, problem });
        })
    }

    pub(super) fn on_call_answered(&mut self, id: Uuid, epoch: u64, problem: Option<String>) {
        let paths = self.ctx.paths.clone();
        let Some(c) = self.computers.get_mut(&id) else {
            return;
        };
        if c.follower.as_ref().map(|f| f.epoch) != Some(epoch) {
            return;
        }
        let Some(why) = problem else {
            if answered_again(c) {
                tracing::info!(computer = %id, "the guest answers calls again");
                self.dirty.insert(id);
                self.check_ready(id);
            }
            return;
        };
        let leaving = matches!(
            c.op.as_ref().map(|o| o.kind()),
            Some(OpKind::Stop { .. } | OpKind::Remove { .. })
        );
        if leaving || !c.engine.is_up() {
            return;
        }
        let why = without_paths(&guest::sanitize(&why), &paths, id);
        if c.guest.calls.as_ref() == Some(&why) {
            return;
        }
        tracing::warn!(computer = %id, problem = %why, "a call to the guest failed on its channel");
        c.guest.calls = Some(why);
        self.dirty.insert(id);
        if c.guest.probe.is_none() {
            let socket = self.ctx.socket(id);
            let report = self.answer_report(id, Some(epoch));
            let probe = self.tasks.spawn(probe(socket, report));
            if let Some(c) = self.computers.get_mut(&id) {
                c.guest.probe = Some(probe);
            }
        }
    }
}

/// Greets the guest on a fresh connection until it answers, pausing longer
/// each time (up to [`PROBE_MAX`]); tells each failure that says something
/// new, and the answer.
async fn probe(socket: GuestSocket, report: AnswerReport) {
    let mut pause = PROBE_FIRST;
    loop {
        tokio::time::sleep(pause).await;
        let bound = guest::CONNECT_TIMEOUT + guest::REQUEST_TIMEOUT;
        let greeted = async { socket.connect().await?.hello().await };
        match tokio::time::timeout(bound, greeted).await {
            Ok(Ok(_)) => {
                report.answered();
                return;
            }
            Ok(Err(e)) => report.failed(e.to_string()),
            Err(_) => report.failed(format!("no greeting within {bound:?}")),
        }
        pause = (pause * 2).min(PROBE_MAX);
    }
}
