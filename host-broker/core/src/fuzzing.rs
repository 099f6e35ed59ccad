//! Entry points of the fuzz targets (`tests/fuzz`) into the checks of this
//! crate that judge a hostile guest's answer. Each calls the check the
//! broker runs, not a copy. Compiled only with the feature `fuzzing`.

use dormouse_protocol::actions::{ActionBatch, ActionName, ActionResults, GuestActionResults};
use dormouse_protocol::image::ImageFormat;

/// The guest's answer to `batch` as the API's, if it fits the batch (what
/// [`crate::relay::actions::relay`] does with the answer it read).
///
/// # Errors
/// Why the answer does not fit the batch.
pub fn fit_answer(
    batch: &ActionBatch,
    answer: GuestActionResults,
    payload: &[u8],
) -> Result<ActionResults, String> {
    let names: Vec<(ActionName, Option<ImageFormat>)> = batch
        .actions
        .iter()
        .map(|a| (a.name(), a.encoding().map(|e| e.format)))
        .collect();
    crate::relay::actions::fit(&names, answer, payload).map_err(|e| e.to_string())
}
