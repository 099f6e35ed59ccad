//! End-to-end: what the live screen admits, against a real `dormoused`, the
//! real engine and the real desktop image (x11vnc behind the supervisor's
//! `vnc.sock`).
//!
//! - Two view capabilities filling their 32 connections each would take
//!   the guest's 64: the broker stops view at 56 and closes the next with
//!   4006 and a reason naming the cause, and the lease holder's control
//!   screen still opens (a whole RFB handshake through x11vnc). The guest's
//!   own count of spliced connections (its `/proc/net/tcp`) is the witness
//!   that it never carried more than 64.
//! - xvp (RFB message 250) is parsed: a view capability's is dropped (the
//!   connection stays up, x11vnc never answers it), a control capability's
//!   reaches x11vnc, which answers an unknown xvp version with a failure.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dormouse_e2e::broker::{with_broker, BrokerProcess};
use dormouse_e2e::client::{create_ready, ApiClient, EventStream};
use dormouse_e2e::guest::{Guest, GuestUser};
use dormouse_e2e::rfb::{set_encodings, set_pixel_format_bgrx, update_request, RfbViewer, TokenIn};
use dormouse_protocol::api::LeaseRequest;
use dormouse_protocol::screen::{
    CreateScreen, ScreenGrant, ScreenMode, CLOSE_SCREEN_FULL, CONTROL_RESERVE,
    MAX_SCREEN_CONNECTIONS,
};
use uuid::Uuid;

const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// xvp version 2 (only 1 exists), code 2 (shutdown).
const XVP_UNKNOWN_VERSION: [u8; 4] = [250, 0, 2, 2];

async fn mint(
    api: &ApiClient,
    id: Uuid,
    mode: ScreenMode,
    generation: Option<u64>,
) -> Result<ScreenGrant> {
    let request = CreateScreen {
        mode,
        ttl_ms: Some(600_000),
        reason: None,
    };
    Ok(api
        .with_generation(generation)
        .create_screen(id, &request)
        .await?)
}

async fn open(broker: &BrokerProcess, grant: &ScreenGrant) -> Result<RfbViewer> {
    let url = format!("ws://{}{}", broker.addr(), grant.websocket);
    RfbViewer::connect(&url, &grant.token, TokenIn::Subprotocol).await
}

/// Past the handshake, asking for Raw 32-bpp pixels.
async fn viewer(broker: &BrokerProcess, grant: &ScreenGrant) -> Result<RfbViewer> {
    let mut v = open(broker, grant).await?;
    v.handshake().await?;
    v.send(&set_pixel_format_bgrx()).await?;
    v.send(&set_encodings(&[0])).await?;
    Ok(v)
}

/// Connections established to x11vnc's loopback port (5900) in the guest.
async fn spliced(guest: &Guest) -> Result<usize> {
    let table = guest.sh_ok(GuestUser::Root, "cat /proc/net/tcp").await?;
    // Local address 127.0.0.1:<ephemeral>, remote 0100007F:170C, state 01.
    Ok(table
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[2] == "0100007F:170C" && f[3] == "01"
        })
        .count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_screen_admits_what_the_guest_carries_and_parses_xvp() -> Result<()> {
    with_broker(
        "the_screen_admits_what_the_guest_carries_and_parses_xvp",
        scenario,
    )
    .await
}

async fn scenario(broker: &BrokerProcess) -> Result<()> {
    let api = broker.client();
    let mut events = EventStream::open(&api).await?;
    let id = create_ready(&api, &mut events, "admission", READY_TIMEOUT).await?;
    let guest = Guest::for_computer(id);
    xvp(broker, &api, id).await?;

    // ---- two watch links cannot deny the screen to the lease holder -------
    let lease = api
        .lease(
            id,
            &LeaseRequest {
                holder: "agent".into(),
                ttl_ms: 600_000,
            },
        )
        .await?;
    let views = [
        mint(&api, id, ScreenMode::View, None).await?,
        mint(&api, id, ScreenMode::View, None).await?,
    ];
    let view_limit = MAX_SCREEN_CONNECTIONS - CONTROL_RESERVE;
    let mut open_views = Vec::new();
    for i in 0..view_limit {
        let grant = &views[i / 32];
        open_views.push(
            open(broker, grant)
                .await
                .with_context(|| format!("view {i}"))?,
        );
    }
    let mut refused = open(broker, &views[1]).await?;
    let closed = refused.closed(Duration::from_secs(5)).await?;
    ensure!(
        closed.code == Some(CLOSE_SCREEN_FULL) && closed.reason.contains("screen full"),
        "view connection {} closed with {closed:?}",
        view_limit + 1
    );
    eprintln!(
        "view connection {}: {} {:?}",
        view_limit + 1,
        CLOSE_SCREEN_FULL,
        closed.reason
    );
    let carried = spliced(&guest).await?;
    eprintln!("the guest splices {carried} connections with {view_limit} views open");
    ensure!(
        carried <= MAX_SCREEN_CONNECTIONS,
        "the guest splices {carried} connections"
    );

    let control = mint(&api, id, ScreenMode::Control, Some(lease.generation)).await?;
    let mut c = viewer(broker, &control)
        .await
        .context("the lease holder's control screen beside 56 views")?;
    c.send(&update_request(false, 0, 0, 16, 16)).await?;
    c.read_update().await.context("control's first update")?;
    let carried = spliced(&guest).await?;
    eprintln!("the guest splices {carried} connections with 56 views and one control");
    ensure!(
        carried <= MAX_SCREEN_CONNECTIONS,
        "the guest splices {carried}"
    );
    for v in open_views {
        v.close().await;
    }
    c.close().await;
    Ok(())
}

/// xvp under view is dropped, under control it reaches x11vnc.
async fn xvp(broker: &BrokerProcess, api: &ApiClient, id: Uuid) -> Result<()> {
    let view = mint(api, id, ScreenMode::View, None).await?;
    let mut v = viewer(broker, &view).await?;
    v.send(&XVP_UNKNOWN_VERSION).await?;
    for _ in 0..3 {
        v.send(&update_request(false, 0, 0, 16, 16)).await?;
        v.read_update()
            .await
            .context("view after its xvp: closed?")?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(
        v.xvp.is_empty(),
        "a view capability's xvp reached x11vnc: {:?}",
        v.xvp
    );
    v.close().await;

    let control = mint(api, id, ScreenMode::Control, None).await?;
    let mut c = viewer(broker, &control).await?;
    c.send(&XVP_UNKNOWN_VERSION).await?;
    for _ in 0..10 {
        c.send(&update_request(false, 0, 0, 16, 16)).await?;
        c.read_update()
            .await
            .context("control after its xvp: closed?")?;
        if !c.xvp.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // x11vnc answers an xvp version it does not speak with xvp_fail (0).
    ensure!(
        c.xvp == [(2, 0)],
        "control's xvp, x11vnc answered {:?}",
        c.xvp
    );
    eprintln!(
        "xvp: view dropped, control reached x11vnc (answered {:?})",
        c.xvp
    );
    c.close().await;
    // The capabilities go, so the admission below starts from nothing.
    api.revoke_screen(view.screen_id).await?;
    api.revoke_screen(control.screen_id).await?;
    Ok(())
}
