//! Screenshots and zooms inside a batch: one capture at a time with the
//! rest of the supervisor (the capture slot), bounded to fit the answer's
//! payload. It never injects input.

use super::*;

/// One capture at a time, also from inside a batch (which runs on a
/// blocking thread, so it waits for the slot by blocking on the runtime).
pub(super) fn acquire_capture_slot(
    runtime: &tokio::runtime::Handle,
    bound: Duration,
) -> Result<tokio::sync::SemaphorePermit<'static>, XError> {
    runtime.block_on(async {
        tokio::time::timeout(bound, screenshot::CAPTURE_SLOT.acquire())
            .await
            .map_err(|_| XError::Timeout(bound))?
            .map_err(|e| XError::Join(e.to_string()))
    })
}

impl Runner<'_> {
    pub(super) fn capture(
        &mut self,
        name: ActionName,
        spec: &CaptureSpec,
    ) -> Result<ActionResult, ActionError> {
        let limit = dormouse_protocol::MAX_PAYLOAD_LEN;
        let room = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(self.image_bytes);
        let _slot = (self.slot)()?;
        let mut image = screenshot::BoundedVec::new(room);
        let stats = screenshot::encode(self.conn, self.screen, spec, &mut image).map_err(|e| {
            if screenshot::is_too_large(&e) {
                ActionError::TooLarge(limit)
            } else {
                ActionError::Screenshot(e)
            }
        })?;
        let image = image.into_inner();
        self.image_bytes += image.len();
        self.images.push(image);
        Ok(ActionResult {
            image: Some(ActionImage {
                media_type: spec.encoding.format.media_type().into(),
                data: String::new(),
            }),
            size: Some([stats.width, stats.height]),
            ..ActionResult::ok(name)
        })
    }
}
