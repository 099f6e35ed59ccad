//! A broker API over the scripted core, for working on the web panel without
//! an engine: `DORMOUSE_DEMO_ADDR=127.0.0.1:7499 cargo test -p dormouse-broker
//! --test api_panel_demo -- --ignored --nocapture` serves until interrupted
//! (token: `api_support::TOKEN`). A started desktop takes 3 s to become ready.

mod api_support;

use std::time::Duration;

use api_support::{Harness, TOKEN};

#[tokio::test]
#[ignore = "serves the panel for manual or browser work until interrupted"]
async fn serve_panel_demo() {
    let addr = std::env::var("DORMOUSE_DEMO_ADDR").unwrap_or_else(|_| "127.0.0.1:7499".into());
    let h = Harness::new();
    h.lock().boot_time = Duration::from_secs(3);
    h.add("stopped-idle", false);
    h.add("running", true);
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    println!("panel demo on http://{addr}/ token {TOKEN}");
    axum::serve(listener, h.router()).await.expect("serve");
}
