//! Guest-protocol messages (`protocol/src/guest.rs`) as each side decodes
//! them: a request as the supervisor takes it (then the checks of the
//! request's own fields), a response as the broker takes it (tamed, then
//! typed as every answer and its payload checked, exec output joined,
//! action results fitted to a batch by the broker's own check, an egress
//! open validated).
//!
//! Input: `batch JSON \0 message JSON \0 payload`; the batch (for action
//! results) is one screenshot when empty or not a batch.
#![no_main]

use dormouse_fuzz::split_at_byte;
use dormouse_protocol::actions::{Action, ActionBatch, ActionResults, GuestActionResults};
use dormouse_protocol::exec::ExecResultHead;
use dormouse_protocol::frame::{decode_message, decode_message_tamed, Taming};
use dormouse_protocol::{Answer, Request, Response};
use libfuzzer_sys::fuzz_target;

/// Types `response` as the answer `A` and checks its payload, as the
/// broker's client does with every answer it reads.
fn typed<A: Answer>(response: &Response, payload: &[u8]) -> Option<A> {
    let answer = A::from_response(response.clone()).ok()?;
    answer.check(payload).ok()?;
    // What one kind of answer is, it is as a response again.
    assert_eq!(&answer_kind::<A>(), &response.kind());
    Some(answer)
}

fn answer_kind<A: Answer>() -> &'static str {
    A::KIND
}

fn request(json: &[u8]) {
    let Ok(request) = decode_message::<Request>(json) else {
        return;
    };
    // The supervisor checks the fields of what it will act on.
    match &request {
        Request::Exec(exec) => drop(exec.validate()),
        Request::PtyOpen(open) => drop(open.validate()),
        Request::Actions { batch } => {
            for screen in [(1280, 800), (1, 1), (7680, 4320)] {
                let size = dormouse_protocol::actions::Size {
                    width: screen.0,
                    height: screen.1,
                };
                drop(dormouse_protocol::actions::validate(batch, Some(size)));
            }
        }
        _ => {}
    }
    let _ = request.kind();
    let _ = request.payload_allowed();
}

fn response(batch: &ActionBatch, json: &[u8], payload: &[u8]) {
    let untamed = decode_message::<Response>(json);
    let Ok(response) = decode_message_tamed::<Response>(json, Some(&Taming::GUEST)) else {
        // Taming only shortens: what the tamed decoder refuses, the
        // plain one refuses too.
        assert!(untamed.is_err(), "taming made a message undecodable");
        return;
    };
    let _ = response.payload_allowed();
    typed::<dormouse_protocol::Hello>(&response, payload);
    typed::<dormouse_protocol::GuestStatus>(&response, payload);
    typed::<dormouse_protocol::Quiesced>(&response, payload);
    typed::<dormouse_protocol::Activity>(&response, payload);
    typed::<dormouse_protocol::guest::PtyOpened>(&response, payload);
    if let Some(shot) = typed::<dormouse_protocol::ScreenshotInfo>(&response, payload) {
        assert!(shot.format.is_signature_of(payload));
    }
    if let Some(clip) = typed::<dormouse_protocol::guest::ClipboardText>(&response, payload) {
        if let Ok(Some(text)) = clip.text(payload) {
            assert_eq!(text.as_bytes(), payload);
        }
    }
    if let Some(head) = typed::<ExecResultHead>(&response, payload) {
        if let Ok(result) = head.clone().join(payload.to_vec()) {
            assert_eq!(result.stdout.len() + result.stderr.len(), payload.len());
            assert_eq!(result.stdout.len() as u64, head.stdout_len);
        }
    }
    if let Some(open) = typed::<dormouse_protocol::egress::EgressOpen>(&response, payload) {
        if open.validate().is_ok() {
            let _ = open.authority();
        }
    }
    if let Some(results) = typed::<GuestActionResults>(&response, payload) {
        if let Ok(api) = results.clone().into_api(payload) {
            assert_eq!(api.results.len(), results.results.len());
        }
        // The broker's own check of an answer against the batch it sent:
        // whatever it accepts is one result per action at most, in order.
        if let Ok(ActionResults { results: fitted }) =
            dormouse_core::fuzzing::fit_answer(batch, results, payload)
        {
            assert!(!fitted.is_empty() && fitted.len() <= batch.actions.len());
            for (result, action) in fitted.iter().zip(&batch.actions) {
                assert_eq!(result.action, action.name());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (batch, rest) = split_at_byte(data, 0);
    let (json, payload) = split_at_byte(rest, 0);
    let batch: ActionBatch = serde_json::from_slice(batch).unwrap_or_else(|_| ActionBatch {
        actions: vec![Action::Screenshot {
            format: None,
            quality: None,
        }],
        scale: None,
        cursor: false,
    });
    request(json);
    response(&batch, json, payload);
});
