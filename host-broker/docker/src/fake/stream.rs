//! The fake engine's event subscriptions: what it broadcasts, filtered by
//! labels as the engine filters them, broken off (with an `Unavailable`
//! error) when the fake goes away.

use futures_util::stream::{BoxStream, StreamExt};
use tokio::sync::{broadcast, watch};

use super::matches_labels;
use crate::container_engine::{EngineError, EngineEvent};

/// Follows `rx` until the fake goes away (`cut` changes); `blind` delivers
/// nothing, as Podman 4.3 does to a bare-key label filter.
pub(super) fn follow(
    rx: broadcast::Receiver<EngineEvent>,
    mut cut: watch::Receiver<u64>,
    wanted: Vec<String>,
    blind: bool,
) -> BoxStream<'static, Result<EngineEvent, EngineError>> {
    cut.mark_unchanged();
    futures_util::stream::unfold(Some((rx, cut)), |open| async move {
        let (mut rx, mut cut) = open?;
        loop {
            tokio::select! {
                received = rx.recv() => match received {
                    Ok(event) => return Some((Ok(event), Some((rx, cut)))),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                _ = cut.changed() => {
                    let gone = EngineError::Unavailable("fake engine went away".into());
                    return Some((Err(gone), None));
                }
            }
        }
    })
    .filter(move |item| {
        let keep = match item {
            Ok(_) if blind => false,
            Ok(event) => matches_labels(&event.labels, &wanted),
            Err(_) => true,
        };
        async move { keep }
    })
    .boxed()
}
