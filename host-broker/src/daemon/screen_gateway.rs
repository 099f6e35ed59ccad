//! Wires the live screen into the daemon: the owner's [`OwnerScreenHost`]
//! behind the gateway, the expiry sweep, and the noVNC directory (a missing
//! one leaves the panel on still screenshots, said once in the log).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use dormouse_http::screen::ScreenGateway;
use dormouse_http::screen_host::OwnerScreenHost;
use dormouse_http::screen_viewer::NovncDir;
use dormouse_http::ApiState;

/// How often expired capabilities are dropped (each connection also closes
/// at its own deadline; this only frees their entries).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Puts the real gateway and noVNC directory into `state`.
pub fn wire(state: &mut ApiState, novnc: &Path, shutdown: &CancellationToken) {
    let host = OwnerScreenHost::new(state.broker.clone());
    let mut gateway = ScreenGateway::new(Arc::new(host), shutdown.clone());
    gateway.registry = state.broker.screens().clone();
    let registry = gateway.registry.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move { registry.sweep_every(SWEEP_EVERY, stop).await });
    state.screens = gateway;
    state.novnc = novnc_dir(novnc);
}

fn novnc_dir(dir: &Path) -> NovncDir {
    if dir.join("core").join("rfb.js").is_file() {
        tracing::info!(dir = %dir.display(), "serving noVNC for the panel's live screens");
        NovncDir(Some(PathBuf::from(dir)))
    } else {
        tracing::warn!(
            dir = %dir.display(),
            "noVNC not found (install the novnc package or pass --novnc-dir); the panel shows still screenshots"
        );
        NovncDir(None)
    }
}
