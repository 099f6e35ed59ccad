//! Wires the live screen into the daemon: the owner's [`OwnerScreenHost`]
//! behind the gateway, the expiry sweep, and the noVNC and xterm.js
//! directories (a missing one is read again on every request: installing
//! the package later needs no restart).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use dormouse_http::screen::ScreenGateway;
use dormouse_http::screen_host::OwnerScreenHost;
use dormouse_http::screen_viewer::NovncDir;
use dormouse_http::xterm::XtermDir;
use dormouse_http::ApiState;

/// How often expired capabilities are dropped (each connection also closes
/// at its own deadline; this only frees their entries).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Puts the real gateway and the noVNC and xterm.js directories into `state`.
pub fn wire(state: &mut ApiState, novnc: &Path, xterm: &Path, shutdown: &CancellationToken) {
    let host = OwnerScreenHost::new(state.broker.clone());
    let mut gateway = ScreenGateway::new(Arc::new(host), shutdown.clone());
    gateway.registry = state.broker.screens().clone();
    let registry = gateway.registry.clone();
    let stop = shutdown.clone();
    tokio::spawn(async move { registry.sweep_every(SWEEP_EVERY, stop).await });
    state.screens = gateway;
    state.novnc = novnc_dir(novnc);
    state.xterm = XtermDir {
        root: Some(PathBuf::from(xterm)),
        ..XtermDir::default()
    };
}

/// The directory is read on every request, so a noVNC installed after the
/// broker started is served without a restart; its absence now is only
/// worth a warning.
fn novnc_dir(dir: &Path) -> NovncDir {
    if dir.join("core").join("rfb.js").is_file() {
        tracing::info!(dir = %dir.display(), "serving noVNC for the panel's live screens");
    } else {
        tracing::warn!(
            dir = %dir.display(),
            "noVNC not found yet (install the novnc package or pass --novnc-dir); until then the panel shows still screenshots"
        );
    }
    NovncDir(Some(PathBuf::from(dir)))
}
