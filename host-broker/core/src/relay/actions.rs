//! A batch of computer-use actions relayed to the guest.
//!
//! Owns the bound the broker waits for a batch's answer and the check of
//! what the guest answers against the batch it was sent. It never executes
//! an action itself and never trusts the guest's answer: results that do
//! not fit the batch are the guest's failure, not the client's answer.

use std::time::Duration;

use dormouse_protocol::actions::{
    self, Action, ActionBatch, ActionName, ActionResults, BatchError, GuestActionResults,
};

use dormouse_protocol::image::ImageFormat;

use crate::command::AnswerReport;
use crate::error::BrokerError;
use crate::guest::{self, GuestError, GuestSocket};

/// Relays a batch (validated by the caller) to the guest and checks the
/// answer against it.
pub async fn relay(
    socket: &GuestSocket,
    answers: &AnswerReport,
    batch: ActionBatch,
) -> Result<ActionResults, BrokerError> {
    let wait = answer_bound(&batch);
    let names: Vec<(ActionName, Option<ImageFormat>)> = batch
        .actions
        .iter()
        .map(|a| (a.name(), a.encoding().map(|e| e.format)))
        .collect();
    let call = async {
        let mut conn = socket.connect().await?;
        conn.actions(batch, wait).await
    };
    match tokio::time::timeout(guest::CONNECT_TIMEOUT + wait, call).await {
        Ok(Ok(frame)) => {
            answers.answered();
            fit(&names, frame.message, &frame.payload)
        }
        Ok(Err(GuestError::Refused { code, message })) if code == BatchError::CODE => {
            answers.answered();
            Err(BrokerError::InvalidActions(message))
        }
        Ok(Err(e)) => {
            if matches!(e, GuestError::Refused { .. }) {
                answers.answered();
            } else {
                answers.failed(e.to_string());
            }
            Err(e.into())
        }
        Err(_) => {
            let why = "the batch of actions did not answer in time";
            answers.failed(why.into());
            Err(BrokerError::GuestFailed(why.into()))
        }
    }
}

/// Checks a batch before anything runs (the guest checks again against its
/// screen); answers the time its own waits take, which the idle timer is
/// renewed past.
pub fn check(batch: &ActionBatch) -> Result<Duration, BrokerError> {
    actions::validate(batch, None).map_err(|e| BrokerError::InvalidActions(e.to_string()))?;
    Ok(Duration::from_secs_f64(batch_durations(batch)))
}

/// The seconds the batch's `wait` and `hold_key` actions take.
fn batch_durations(batch: &ActionBatch) -> f64 {
    batch
        .actions
        .iter()
        .map(Action::duration)
        .sum::<f64>()
        .clamp(0.0, actions::MAX_BATCH_DURATION_SECS)
}

/// What the broker waits for a batch's answer beyond the supervisor's own
/// wait: the frame's way back and a busy guest's scheduling.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// How long the broker waits for a batch's answer: the supervisor's own
/// wait ([`actions::guest_wait`], the protocol's one formula, with a
/// screenshot bound per image), plus [`ANSWER_MARGIN`], so a batch the
/// supervisor ends at its bound is answered `timeout` by the supervisor
/// rather than given up on here.
pub fn answer_bound(batch: &ActionBatch) -> Duration {
    actions::guest_wait(batch, guest::SCREENSHOT_TIMEOUT).saturating_add(ANSWER_MARGIN)
}

/// The guest's answer as the API's, if it fits the batch: one result per
/// action that ran, in order and of its name, every one but the last `ok`,
/// fewer than the batch only when the last failed, images only where a
/// `screenshot` or `zoom` succeeded, each of the format its action asked
/// for, by its media type and by its bytes' signature, a clipboard text
/// (in the payload, after the images) only where a `clipboard_get`
/// succeeded, within its bound.
pub(crate) fn fit(
    names: &[(ActionName, Option<ImageFormat>)],
    answer: GuestActionResults,
    payload: &[u8],
) -> Result<ActionResults, BrokerError> {
    let bad = |why: String| {
        Err(BrokerError::GuestFailed(format!(
            "the answer to the batch does not fit it: {why}"
        )))
    };
    let results = &answer.results;
    if results.is_empty() || results.len() > names.len() {
        return bad(format!(
            "{} results for {} actions",
            results.len(),
            names.len()
        ));
    }
    let last = results.len() - 1;
    let mut formats = Vec::new();
    for (i, (r, (name, asked))) in results.iter().zip(names).enumerate() {
        if r.action != *name {
            return bad(format!("result {i} is for {}, not {name}", r.action));
        }
        if r.ok == r.error.is_some() || (!r.ok && i != last) {
            return bad(format!(
                "result {i} is neither a success nor the last failure"
            ));
        }
        let imaging = matches!(name, ActionName::Screenshot | ActionName::Zoom) && r.ok;
        if r.image.is_some() != imaging || r.size.is_some() != imaging {
            return bad(format!("result {i} has an image where none belongs"));
        }
        if let (Some(image), Some(asked)) = (&r.image, asked) {
            if image.media_type != asked.media_type() {
                return bad(format!(
                    "result {i} has an image of {:?}, not {}",
                    image.media_type,
                    asked.media_type()
                ));
            }
            formats.push(*asked);
        }
        if r.coordinate.is_some() != (*name == ActionName::CursorPosition && r.ok) {
            return bad(format!("result {i} has a coordinate where none belongs"));
        }
        // A clipboard text travels in the payload, never in the header.
        if r.text.is_some() {
            return bad(format!("result {i} has a text in its header"));
        }
    }
    if results.len() < names.len() && results[last].ok {
        return bad("the batch stopped without a failure".into());
    }
    // Each image is of its format: its bytes begin with the signature.
    let mut rest = payload;
    for (len, format) in answer.image_lens.iter().zip(&formats) {
        let Some(len) = usize::try_from(*len).ok().filter(|l| *l <= rest.len()) else {
            break; // into_api names the mismatch
        };
        let (image, tail) = rest.split_at(len);
        if !format.is_signature_of(image) {
            return bad(format!("an image that is not a {format}"));
        }
        rest = tail;
    }
    let most = u64::try_from(actions::MAX_CLIPBOARD_BYTES).unwrap_or(u64::MAX);
    if answer.text_lens.iter().any(|l| *l > most) {
        return bad("a clipboard text over its bound".into());
    }
    match answer.into_api(payload) {
        Ok(api) => Ok(api),
        Err(e) => bad(e.to_string()),
    }
}
